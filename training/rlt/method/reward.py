"""The RLT reward (Cetin et al., arXiv 2506.08388), usable on its own and as a TRL reward function.

For an explanation E of question q with solution s, student π_s, teacher π_θ, temperature τ:
  r_SS = mean_t ℓ_t + α·min_t ℓ_t      ℓ_t = log π_s^τ(s_t | q, E)  over the solution tokens of the student chat
  r_KL = mean_t Δ_t + α·max_t Δ_t      Δ_t = log π_θ^τ(e_t | q, s) − log π_s^τ(e_t | q)  over the explanation tokens
  R    = r_SS − λ·r_KL − penalty·[the explanation was not closed]
Tokens are matched to E and s by character offsets. Teacher and student log-probs over E are paired by
`rlt.method.pairing` (per token where both sides tokenise E identically, per shared character range otherwise; see
docs/reward.md). The teacher's log-probs come from generation (`teacher_logprobs`) when the caller has them,
else from one teacher forward here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from rlt.contract.metrics import REWARD_COMPONENTS
from rlt.method.pairing import SideTokens, pair_explanation
from rlt.method.prompts import Formatter, Span
from rlt.method.scoring import ScoreRequest, SpanScorer, completion_token_offsets
from rlt.spec.stages import RewardSpec, RlStage

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


# The reward's defaults have one home, the spec (stages.rl.reward and rl.temperature): a caller of RLTReward without a
# spec gets what a run without those fields gets.
DEFAULTS = RewardSpec()
RL_TEMPERATURE: float = RlStage.model_fields["temperature"].default

EMPTY_KL = 1.0  # Δ-reduction of an empty explanation: a penalty, never a free pass


@dataclass
class RewardBreakdown:
    total: list[float] = field(default_factory=list)
    r_ss: list[float] = field(default_factory=list)
    r_kl: list[float] = field(default_factory=list)
    format_penalty: list[float] = field(default_factory=list)
    solution_logprob_mean: list[float] = field(default_factory=list)
    solution_logprob_min: list[float] = field(default_factory=list)
    kl_mean: list[float] = field(default_factory=list)
    kl_max: list[float] = field(default_factory=list)
    # kl_mean's two parts, kl_mean = kl_teacher_logprob + kl_student_ce: the teacher's own mean log-prob of E (≤ 0,
    # near 0 for a confident teacher) and the student's mean cross-entropy on E (its surprise at the wording)
    kl_teacher_logprob: list[float] = field(default_factory=list)
    kl_student_ce: list[float] = field(default_factory=list)
    solution_tokens: list[int] = field(default_factory=list)
    explanation_tokens: list[int] = field(default_factory=list)
    pairing_coverage: list[float] = field(default_factory=list)  # share of E's tokens (both sides) that got a Δ

    COMPONENTS = REWARD_COMPONENTS  # the fields above that are reward components (one list: rlt.contract.metrics)

    def row(self, i: int) -> dict[str, float]:
        return {k: v[i] for k, v in asdict(self).items()}

    def means(self) -> dict[str, float]:
        out = {}
        for k in ("total",) + self.COMPONENTS + ("pairing_coverage",):
            vals = getattr(self, k)
            out[k] = sum(vals) / len(vals) if vals else float("nan")
        return out


@dataclass
class RewardCall:
    """One call of a reward function by TRL: the batch's questions, solutions and completion texts, TRL's metric
    logger, and the other keywords TRL passes (completion_ids, teacher_logprobs, ...)."""

    questions: list[str]
    solutions: list[str]
    texts: list[str]
    log_metric: Callable[[str, float], None] | None
    extra: dict[str, Any]


class GrpoReward(Protocol):
    """The reward protocol: what rlt.stages.rl.train_grpo takes. TRL's GRPOTrainer calls it with the prompts, the
    completions (text or chat messages), the dataset columns `question` and `solution` as keyword lists and its
    extras (`log_metric`, `completion_ids`, ...), and names it by `__name__` in its logs. RLTReward and RCLReward
    are two; a method brings its own (it need not subclass RewardFunction)."""

    @property
    def __name__(self) -> str: ...

    def __call__(
        self, prompts: list[Any], completions: list[Any], question: list[str], solution: list[str], **extra: Any
    ) -> list[float]: ...


class RewardFunction:
    """A reward as TRL's GRPOTrainer calls it: the prompts, the completions (text or chat messages), the dataset
    columns `question` and `solution` as keyword lists, and TRL's extras (`log_metric`, `completion_ids`, ...).
    Subclasses score the call in `reward`."""

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        question: list[str],
        solution: list[str],
        log_metric: Callable[[str, float], None] | None = None,
        **extra: Any,
    ) -> list[float]:
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return self.reward(RewardCall(question, solution, texts, log_metric, extra))

    def reward(self, call: RewardCall) -> list[float]:
        raise NotImplementedError


class RLTReward(RewardFunction):
    """Score explanations with a frozen student (and the teacher's log-probs)."""

    __name__ = "rlt_reward"  # TRL names reward functions by __name__ in its logs

    def __init__(
        self,
        student: PreTrainedModel,
        student_tokenizer: PreTrainedTokenizerBase,
        formatter: Formatter,
        *,
        alpha: float = DEFAULTS.alpha,
        kl_weight: float = DEFAULTS.kl_weight,
        format_penalty: float = DEFAULTS.format_penalty,
        temperature: float = RL_TEMPERATURE,
        teacher: PreTrainedModel | None = None,
        teacher_tokenizer: PreTrainedTokenizerBase | None = None,
        batch_size: int = DEFAULTS.batch_size,
        share_prefix: bool = DEFAULTS.share_prefix,
        max_batch_tokens: int | None = None,
        teacher_temperature: float | None = None,
    ) -> None:
        """`temperature`: the student's log-probs'; `teacher_temperature` (default: the same): the teacher's when
        its forward scores them (without `teacher_logprobs`), the temperature its sampled log-probs would have."""
        self.fmt = formatter
        self.teacher_temperature = float(teacher_temperature or temperature)
        self.alpha, self.kl_weight, self.penalty = alpha, kl_weight, format_penalty
        self.student_tokenizer = student_tokenizer
        self.student = SpanScorer(
            student, student_tokenizer, temperature, batch_size, share_prefix, max_batch_tokens=max_batch_tokens
        )
        self.teacher_tokenizer = teacher_tokenizer or student_tokenizer
        self.same_vocab = _same_vocab(self.teacher_tokenizer, student_tokenizer)
        self.teacher = (
            SpanScorer(
                teacher,
                self.teacher_tokenizer,
                self.teacher_temperature,
                batch_size,
                share_prefix,
                max_batch_tokens=max_batch_tokens,
            )
            if teacher is not None
            else None
        )
        self.last: RewardBreakdown | None = None
        self.last_seconds = 0.0
        self.last_pairing_seconds = 0.0  # offsets of generated tokens + teacher/student pairing, inside last_seconds
        self.scored_tokens_total = 0

    def set_teacher(self, teacher: PreTrainedModel) -> None:
        """Point the fallback teacher scorer at a (new) model, e.g. the live policy."""
        self.teacher = SpanScorer(
            teacher,
            self.teacher_tokenizer,
            self.teacher_temperature,
            self.student.batch_size,
            self.student.share_prefix,
            max_batch_tokens=self.student.max_batch_tokens,
        )

    # ---- teacher log-probs of E
    def _teacher_from_generation(
        self,
        completions: Sequence[str],
        completion_ids: Sequence[Sequence[int]],
        teacher_logprobs: Sequence[Sequence[float]],
        explanations: Sequence[str],
    ) -> list[SideTokens]:
        out = []
        for text, ids, lps, expl in zip(completions, completion_ids, teacher_logprobs, explanations, strict=True):
            if len(ids) != len(lps):
                raise ValueError(f"teacher_logprobs has {len(lps)} values for {len(ids)} completion ids")
            offs, decoded = completion_token_offsets(self.teacher_tokenizer, ids)
            if decoded != text:
                raise ValueError(
                    "completion_ids do not decode to the completion text they come with: "
                    f"{decoded[:60]!r} vs {text[:60]!r}"
                )
            keep = [k for k, (s, e) in enumerate(offs) if e > s and e <= len(expl)]
            out.append(SideTokens([offs[k] for k in keep], [ids[k] for k in keep], [float(lps[k]) for k in keep]))
        return out

    def _teacher_from_forward(
        self,
        questions: Sequence[str],
        solutions: Sequence[str],
        completions: Sequence[str],
        explanations: Sequence[str],
    ) -> list[SideTokens]:
        if self.teacher is None:
            raise ValueError("RLTReward needs teacher log-probs: pass teacher_logprobs or construct it with teacher=")
        requests = []
        for q, s, c, e in zip(questions, solutions, completions, explanations, strict=True):
            prompt = self.fmt.teacher_prompt(self.teacher_tokenizer, q, s)
            requests.append(ScoreRequest(prompt + c, [Span(len(prompt), len(prompt) + len(e))], group=(q, s)))
        return [SideTokens(sc[0].offsets, sc[0].ids, sc[0].logprobs.tolist()) for sc in self.teacher.score(requests)]

    # ---- public API
    def score(
        self,
        questions: Sequence[str],
        solutions: Sequence[str],
        completions: Sequence[str],
        teacher_logprobs: Sequence[Sequence[float]] | None = None,
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> RewardBreakdown:
        """Rewards of teacher completions (the text written after the opening explanation tag).

        `teacher_logprobs` (per generated token, at temperature τ) with `completion_ids` skip the teacher forward."""
        if not (len(questions) == len(solutions) == len(completions)):
            raise ValueError("questions, solutions and completions must have the same length")
        started = time.perf_counter()
        parts = [self.fmt.split_explanation(c) for c in completions]
        explanations = [e for e, _ in parts]
        if teacher_logprobs is not None:
            if completion_ids is None:
                raise ValueError("teacher_logprobs need the completion_ids they belong to")
            t0 = time.perf_counter()
            teacher = self._teacher_from_generation(completions, completion_ids, teacher_logprobs, explanations)
            pairing_seconds = time.perf_counter() - t0
        else:
            teacher = self._teacher_from_forward(questions, solutions, completions, explanations)
            pairing_seconds = 0.0

        requests = []
        for q, s, e in zip(questions, solutions, explanations, strict=True):
            text, e_span, s_span = self.fmt.student_chat(self.student_tokenizer, q, e, s)
            requests.append(ScoreRequest(text, [e_span, s_span], group=q))
        scores = self.student.score(requests)

        out = RewardBreakdown()
        for (expl, closed), (e_sc, s_sc), t_lp in zip(parts, scores, teacher, strict=True):
            sol = s_sc.logprobs
            if len(sol) == 0:
                raise ValueError("no solution token could be scored: the solution text is empty after tokenisation")
            sol_mean, sol_min = float(sol.mean()), float(sol.min())
            t0 = time.perf_counter()
            pairing = pair_explanation(
                t_lp, SideTokens(e_sc.offsets, e_sc.ids, e_sc.logprobs.tolist()), self.same_vocab
            )
            pairing_seconds += time.perf_counter() - t0
            deltas = pairing.deltas
            kl_mean = sum(deltas) / len(deltas) if deltas else EMPTY_KL
            kl_max = max(deltas) if deltas else EMPTY_KL
            # an empty E: the whole EMPTY_KL is counted as the student's part (the teacher said nothing)
            t_part = sum(pairing.teacher) / len(deltas) if deltas else 0.0
            s_part = -sum(pairing.student) / len(deltas) if deltas else EMPTY_KL
            r_ss = sol_mean + self.alpha * sol_min
            r_kl = kl_mean + self.alpha * kl_max
            pen = 0.0 if closed else self.penalty
            total = r_ss - self.kl_weight * r_kl - pen
            if not math.isfinite(total):
                raise FloatingPointError(
                    f"reward is not finite (r_ss={r_ss}, r_kl={r_kl}) for explanation {expl[:80]!r}"
                )
            out.total.append(total)
            out.r_ss.append(r_ss)
            out.r_kl.append(r_kl)
            out.format_penalty.append(pen)
            out.solution_logprob_mean.append(sol_mean)
            out.solution_logprob_min.append(sol_min)
            out.kl_mean.append(kl_mean)
            out.kl_max.append(kl_max)
            out.kl_teacher_logprob.append(t_part)
            out.kl_student_ce.append(s_part)
            out.solution_tokens.append(len(sol))
            out.explanation_tokens.append(len(e_sc))
            out.pairing_coverage.append(pairing.coverage)
        self.last = out
        self.last_seconds = time.perf_counter() - started
        self.last_pairing_seconds = pairing_seconds
        self.scored_tokens_total += sum(out.solution_tokens) + sum(out.explanation_tokens)
        return out

    def reward(self, call: RewardCall) -> list[float]:
        """The generation's log-probs (`teacher_logprobs` with `completion_ids`) are used when every row has them."""
        teacher_logprobs = call.extra.get("teacher_logprobs")
        if teacher_logprobs is not None and any(lp is None for lp in teacher_logprobs):
            teacher_logprobs = None
        result = self.score(
            call.questions, call.solutions, call.texts, teacher_logprobs, call.extra.get("completion_ids")
        )
        if call.log_metric is not None:
            for k, v in result.means().items():
                if k != "total":
                    call.log_metric(f"rlt/{k}", v)
        return result.total


def _same_vocab(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase) -> bool:
    """Whether two tokenizers map the same strings to the same ids (then identical ids mean identical tokens)."""
    return a is b or a.get_vocab() == b.get_vocab()
