"""The RCL reward: the student's performance gain from the guidance, losses charged `degradationPenalty` times.

Pure core (`rcl_reward`) with a table test; `RCLReward` runs the student (baseline once per question, then with
each guidance) and is both a plain scorer and a TRL reward function.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlt.data.answers import boxed_contents, extract_answer, normalize
from rlt.method.reward import RewardCall, RewardFunction
from rlt.rcl.protocol import Protocol

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rlt.method.scoring import SpanScorer
    from rlt.spec.run import RclSpec

ZERO = 1e-9  # |Δ| at or below this counts as no change (accuracies are k/n, exact in float for small n)


@dataclass(frozen=True)
class RewardParams:
    """Every number of the reward; defaults are RclSpec's."""

    degradation_penalty: float = 2.0
    efficiency_weight: float = 0.5
    efficiency_tokens: int = 200
    maintain_bonus: float = 0.1
    strong_threshold: float = 0.75
    answer_leak_penalty: float = 0.0
    format_penalty: float = 1.0

    @classmethod
    def from_spec(cls, rcl: RclSpec) -> RewardParams:
        return cls(
            rcl.degradation_penalty,
            rcl.efficiency_weight,
            rcl.efficiency_tokens,
            rcl.maintain_bonus,
            rcl.strong_threshold,
            rcl.answer_leak_penalty,
            rcl.format_penalty,
        )


def efficiency(teaching_tokens: int, l0: int) -> float:
    """eff = L0 / (L0 + tokens): 1 for no teaching, 1/2 at L0 tokens."""
    return l0 / (l0 + teaching_tokens)


def rcl_reward(
    perf_base: float,
    perf_with: float | None,
    teaching_tokens: int,
    *,
    leaked: bool = False,
    p: RewardParams = RewardParams(),
) -> float:
    """Reward of one guidance. perf_with None = the guidance tags were missing (format penalty, nothing passed on)."""
    if perf_with is None:
        return -p.format_penalty
    delta = perf_with - perf_base
    bonus = p.efficiency_weight * efficiency(teaching_tokens, p.efficiency_tokens)
    if delta > ZERO:
        r = delta * (1.0 + bonus)
    elif delta < -ZERO:
        r = p.degradation_penalty * delta
    elif perf_base >= p.strong_threshold:
        r = bonus * p.maintain_bonus
    else:
        r = 0.0
    return r - (p.answer_leak_penalty if leaked else 0.0)


_NUMBERS = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def states_answer(guidance: str, solution: str) -> bool:
    """Does the guidance state the reference answer? Numbers and boxes are compared normalised, text as a phrase."""
    want = normalize(extract_answer(solution, last_number=False) or solution)
    if not want:
        return False
    candidates = boxed_contents(guidance) + _NUMBERS.findall(guidance)
    if any(normalize(c) == want for c in candidates):
        return True
    if _NUMBERS.fullmatch(want):
        return False
    text, phrase = re.sub(r"\s+", " ", guidance).lower(), re.escape(want.lower())
    if len(want) == 1:  # a choice letter: only where it names an option ("(C)", "C)", "option C"), not a variable c
        return (
            re.search(rf"\({phrase}\)|(?<!\w){phrase}\)|(?:answer|option|choice)(?: is)?:? ?\(?{phrase}\b", text)
            is not None
        )
    return re.search(rf"(?<!\w){phrase}(?!\w)", text) is not None  # a phrase: "even" is not in "seven"


# --------------------------------------------------------------------------- running the student

AnswerFn = Callable[[list[str], int], list[list[str]]]  # prompts, n -> n answers per prompt


def student_sampler(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    temperature: float,
    max_new_tokens: int,
    batch_size: int = 32,
) -> AnswerFn:
    """n sampled answers per prompt from a frozen student, all prompts batched (the shared sampling helper)."""
    from rlt.method.generation import sample_texts

    def answer(prompts: list[str], n: int) -> list[list[str]]:
        if not prompts:
            return []
        texts = sample_texts(
            model,
            tokenizer,
            [p for p in prompts for _ in range(n)],
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
        )
        return [texts[i * n : (i + 1) * n] for i in range(len(prompts))]

    return answer


@dataclass
class RclBatch:
    """Per completion: reward and its inputs; per question (in first-seen order): the baseline."""

    reward: list[float] = field(default_factory=list)
    perf_base: list[float] = field(default_factory=list)
    perf_with: list[float | None] = field(default_factory=list)
    teaching_tokens: list[int] = field(default_factory=list)
    leaked: list[bool] = field(default_factory=list)
    question_index: list[int] = field(default_factory=list)  # which unique question each completion belongs to

    def problems(self) -> list[tuple[float, float, float]]:
        """(accuracy without, mean accuracy with, mean teaching tokens) per question; a missing guidance counts as
        no guidance (the student would have answered alone), i.e. perf_with = perf_base and 0 tokens."""
        out = []
        for q in sorted(set(self.question_index)):
            idx = [i for i, k in enumerate(self.question_index) if k == q]
            withs = [self.perf_base[i] if (w := self.perf_with[i]) is None else w for i in idx]
            out.append(
                (self.perf_base[idx[0]], sum(withs) / len(withs), sum(self.teaching_tokens[i] for i in idx) / len(idx))
            )
        return out

    def ndr_per_sample(self) -> float:
        """1 − share of guidance samples after which the student did worse than alone (any drop counts; a missing
        guidance passes nothing on, so it cannot degrade). Stricter than the per-question NDR of `means()`."""
        graded = [(b, w) for b, w in zip(self.perf_base, self.perf_with, strict=True) if w is not None]
        return 1.0 - sum(w < b - 1e-9 for b, w in graded) / len(graded) if graded else float("nan")

    def means(self) -> dict[str, float]:
        from rlt.rcl.summary import step_values, summarize_problems

        n = max(1, len(self.reward))
        return {
            "reward": sum(self.reward) / n,
            **step_values(
                {
                    **summarize_problems(self.problems()),
                    "ndr_samples": self.ndr_per_sample(),
                    "format_ok": sum(p is not None for p in self.perf_with) / n,
                    "leak_rate": sum(self.leaked) / n,
                }
            ),
        }


class RCLReward(RewardFunction):
    """Scores teacher completions by the student's gain. Usable standalone (`score`) and as a TRL reward function."""

    __name__ = "rcl"

    def __init__(
        self,
        protocol: Protocol,
        student_tokenizer: PreTrainedTokenizerBase,
        answer_fn: AnswerFn,
        *,
        samples: int,
        params: RewardParams = RewardParams(),
        teacher_tokenizer: PreTrainedTokenizerBase | None = None,
        performance: str = "accuracy",
        scorer: SpanScorer | None = None,
    ) -> None:
        if performance == "dense" and scorer is None:
            raise ValueError("spec.rcl.performance: dense needs a SpanScorer over the student")
        self.protocol, self.tok, self.answer_fn = protocol, student_tokenizer, answer_fn
        self.samples, self.params, self.performance, self.scorer = samples, params, performance, scorer
        self.teacher_tok = teacher_tokenizer or student_tokenizer
        self.last: RclBatch | None = None
        self.student_prompts_total = 0  # student prompts answered or scored (tests count baseline work with it)

    # performance of the student on (question, guidance|None) pairs
    def performance_of(self, items: Sequence[tuple[str, str | None]], solutions: Sequence[str]) -> list[float]:
        prompts = [self.protocol.student_prompt(self.tok, q, g) for q, g in items]
        self.student_prompts_total += len(prompts)
        if self.performance == "dense":
            return self._dense(prompts, solutions)
        answers = self.answer_fn(prompts, self.samples)
        return [
            sum(self.protocol.correct(a, q, s) for a in ans) / len(ans)
            for ans, (q, _), s in zip(answers, items, solutions, strict=True)
        ]

    def _dense(self, prompts: list[str], solutions: Sequence[str]) -> list[float]:
        """exp(mean tempered log-prob of the reference answer): a per-token probability in (0, 1]."""
        from rlt.method.prompts import Span
        from rlt.method.scoring import ScoreRequest

        reqs = []
        for k, (p, s) in enumerate(zip(prompts, solutions, strict=True)):
            answer = self.protocol.student_answer_text(s)
            start = len(p) + len(self.protocol.fmt.answer_start)
            reqs.append(ScoreRequest(p + answer, [Span(start, start + len(s))], group=k))
        if self.scorer is None:  # __init__ refuses dense without one
            raise ValueError("spec.rcl.performance: dense needs a SpanScorer over the student")
        out = []
        for (span,) in self.scorer.score(reqs):
            out.append(math.exp(float(span.logprobs.mean())) if len(span) else 0.0)
        return out

    def score(self, questions: Sequence[str], solutions: Sequence[str], completions: Sequence[str]) -> RclBatch:
        order: dict[str, int] = {}
        for q in questions:
            order.setdefault(q, len(order))
        sol_of = {q: s for q, s in zip(questions, solutions, strict=True)}
        uniq = list(order)
        # the no-guidance baseline: once per question, shared by every guidance of its group
        base = dict(zip(uniq, self.performance_of([(q, None) for q in uniq], [sol_of[q] for q in uniq]), strict=True))
        guidance = [self.protocol.extract_guidance(c) for c in completions]
        todo = [i for i, g in enumerate(guidance) if g]  # zero-length guidance = the student alone: its baseline
        with_perf = self.performance_of([(questions[i], guidance[i]) for i in todo], [solutions[i] for i in todo])
        perf_with: list[float | None] = [None] * len(completions)
        for i, v in zip(todo, with_perf, strict=True):
            perf_with[i] = v
        for i, g in enumerate(guidance):
            if g == "":
                perf_with[i] = base[questions[i]]
        out = RclBatch()
        for i, (q, s) in enumerate(zip(questions, solutions, strict=True)):
            g = guidance[i]
            tokens = len(self.teacher_tok(g, add_special_tokens=False).input_ids) if g else 0
            leaked = states_answer(g, s) if g else False
            out.reward.append(rcl_reward(base[q], perf_with[i], tokens, leaked=leaked, p=self.params))
            out.perf_base.append(base[q])
            out.perf_with.append(perf_with[i])
            out.teaching_tokens.append(tokens)
            out.leaked.append(leaked)
            out.question_index.append(order[q])
        self.last = out
        return out

    def reward(self, call: RewardCall) -> list[float]:
        batch = self.score(call.questions, call.solutions, call.texts)
        if call.log_metric is not None:
            for k, v in batch.means().items():
                if k != "reward" and math.isfinite(v):
                    call.log_metric(k, v)
        return batch.reward
