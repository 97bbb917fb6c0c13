"""Stage `evaluate` (method rlt): accuracy of a model on held-out questions, pass@1 averaged over `samples`.

The model answers in the student format (student system prompt, question); its answer is taken from the
solution tags and checked with rlt.data.answers (math), as a letter (choice), or with the built-in task's checker.
Writes eval/report.json, eval/report.md, eval/per_question.jsonl and eval/accuracy.png.

Four steps, each its own function: generate (`generate_answers`, one call over every question), grade (`grade`,
pure, once per answer, into `QuestionResult` records), report (`build_report`, pure, an `EvalReport` from the
records) and write (`write_report`, the files).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlt.contract import metrics as catalogue
from rlt.contract.layout import (
    ACCURACY_PLOT,
    PER_QUESTION_FILE,
    REPORT_JSON,
    REPORT_MD,
    MissingStageInput,
    atomic_write_json,
    atomic_write_text,
)
from rlt.contract.stage_registry import producer_of
from rlt.data import answers, tasks
from rlt.data.eval_set import EvalSet, evaluation_set
from rlt.data.jsonl import camel_json, from_camel_json, read_jsonl, write_jsonl
from rlt.method.prompts import Formatter
from rlt.spec.inputs import ModelRef
from rlt.spec.stages import trained_student
from rlt.stages.context import StageContext
from rlt.stages.ranks import gather_shares, shard_rows
from rlt.stages.record import Recorder

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rlt.spec.stages import EvaluateStage

    # after each generated batch: its first row, each row's answers, the tokens generated
    OnBatch = Callable[[int, list[list[str]], int], None]

# --------------------------------------------------------------------------- what is evaluated, on what


def eval_set(ctx: StageContext) -> EvalSet:
    """The questions (rlt.data.eval_set: the same rows for both methods' evaluate stages and `rlt compare`)."""
    return evaluation_set(ctx.spec, ctx.formatter.fmt)


def eval_target(ctx: StageContext) -> tuple[str, ModelRef]:
    """(label, model): the spec's model, else the student stage's model, else the untrained student."""
    spec, st = ctx.spec, ctx.spec.stages.evaluate
    if st.model is not None:
        return "custom", st.model
    # the student is the product of the last enabled stage before evaluate producing one (the stage table)
    source = producer_of("student", spec.stages.enabled(), before="evaluate")
    if source is not None:
        if not ctx.layout.stage_done(source).exists():
            raise MissingStageInput(f"stage evaluate needs the {source} stage's model; run stage {source} first")
        path = str(ctx.layout.product(source))
        return "student", trained_student(spec).model_copy(update={"model": path, "revision": None})
    return "baseline", trained_student(spec)


# --------------------------------------------------------------------------- grading (pure)


@dataclass(frozen=True)
class GradedAnswer:
    text: str
    extracted: str | None
    correct: bool


@dataclass(frozen=True)
class QuestionResult:
    """One question's answers, graded: a line of per_question.jsonl."""

    row: Any  # the question's row number in its source (None when the source has none)
    question: str
    solution: str
    answers: tuple[GradedAnswer, ...]

    @property
    def accuracy(self) -> float:
        return sum(a.correct for a in self.answers) / len(self.answers)

    def to_json(self) -> dict[str, Any]:
        return {
            "row": self.row,
            "question": self.question,
            "solution": self.solution,
            "accuracy": self.accuracy,
            "answers": [{"text": a.text, "extracted": a.extracted, "correct": a.correct} for a in self.answers],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> QuestionResult:
        answers = tuple(GradedAnswer(a["text"], a["extracted"], a["correct"]) for a in d["answers"])
        return cls(d["row"], d["question"], d["solution"], answers)


def answer_tags(formatter: Formatter) -> tuple[str, str]:
    """Where an answer is read from: the solution tags of the student format."""
    return formatter.t.solution_start, formatter.t.solution_end


def grade(row: dict[str, Any], output: str, answer_type: str, tags: tuple[str, str]) -> tuple[str | None, bool]:
    """(extracted answer, correct) of one model output for one question."""
    if answer_type == "choice":
        got = answers.normalize(answers.extract_answer(output, tags, last_number=False))
        want = answers.normalize(row["solution"])
        return got, got is not None and len(got) == 1 and got == want
    if answer_type == "builtin":
        answer, verdict = tasks.verify_builtin(row["question"], output, tags)
        if verdict is not None:  # countdown/basic: verified from the question itself; other built-in rows are math
            return answer, verdict
    if answer_type not in ("math", "builtin"):
        raise ValueError(f"stages.evaluate.answerType: unknown {answer_type!r}")
    got = answers.extract_answer(output, tags)
    return got, answers.is_correct(output, row["solution"], tags)


def grade_question(
    row: dict[str, Any], outputs: Sequence[str], answer_type: str, tags: tuple[str, str]
) -> QuestionResult:
    """Every answer of one question graded once."""
    graded = tuple(GradedAnswer(o, *grade(row, o, answer_type, tags)) for o in outputs)
    return QuestionResult(row.get("row"), row["question"], row["solution"], graded)


def pass_at_1(per_question: Sequence[Sequence[bool]]) -> float:
    """Mean over questions of the share of correct answers (pass@1 estimated from every sample)."""
    if not per_question:
        raise ValueError("no questions")
    return sum(sum(c) / len(c) for c in per_question) / len(per_question)


# --------------------------------------------------------------------------- the report (pure)


@dataclass(frozen=True)
class EvalReport:
    """report.json of one model on one set (camelCase on disk)."""

    model: str  # label: student, custom, baseline, or a compare arm
    model_path: str
    dataset: str
    answer_type: str
    questions: int
    samples: int
    temperature: float
    max_new_tokens: int
    accuracy: float
    stderr: float | None
    correct: int
    answers: int
    seconds: float
    generated_tokens: int

    def to_json(self) -> dict[str, Any]:
        return camel_json(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> EvalReport:
        return from_camel_json(cls, doc)


def build_report(
    label: str,
    model_path: str,
    evalset: EvalSet,
    st: EvaluateStage,
    results: Sequence[QuestionResult],
    seconds: float,
    generated_tokens: int,
) -> EvalReport:
    """The report of graded questions: pass@1 over questions, its standard error, the answer counts."""
    accs = [q.accuracy for q in results]
    n = len(accs)
    acc = pass_at_1([[a.correct for a in q.answers] for q in results])
    return EvalReport(
        model=label,
        model_path=model_path,
        dataset=evalset.source,
        answer_type=evalset.answer_type,
        questions=n,
        samples=st.samples,
        temperature=st.temperature,
        max_new_tokens=st.max_new_tokens,
        accuracy=acc,
        # standard error of the mean over questions (per-question accuracies are the unit)
        stderr=math.sqrt(sum((a - acc) ** 2 for a in accs) / (n - 1) / n) if n > 1 else None,
        correct=sum(a.correct for q in results for a in q.answers),
        answers=sum(len(q.answers) for q in results),
        seconds=round(seconds, 1),
        generated_tokens=generated_tokens,
    )


# --------------------------------------------------------------------------- generation


def generate_answers(
    model: PreTrainedModel | None,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    st: EvaluateStage,
    server_url: str | None = None,
    on_batch: OnBatch | None = None,
) -> list[list[str]]:
    """`st.samples` decoded answers per prompt (settings: stages.evaluate), in-process (the shared sampler; greedy at
    temperature 0) or from the vLLM server at `server_url`."""
    from rlt.method.generation import greedy, sample_with_logprobs, server_generate

    samples, temperature, top_p, max_new_tokens = st.samples, st.temperature, st.top_p, st.max_new_tokens
    batch_size, timeout = st.batch_size, st.generation.server_timeout_seconds
    prompt_ids = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    out: list[list[str]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompt_ids[start : start + batch_size]
        if server_url:
            ids = server_generate(
                server_url,
                chunk,
                n=samples,
                temperature=temperature,
                top_p=top_p,
                max_new_tokens=max_new_tokens,
                timeout=timeout,
            ).completion_ids
        elif temperature > 0:
            if model is None:  # the caller loads the model whenever no server generates
                raise ValueError("in-process sampling needs the model: none was loaded and no server URL was given")
            ids = sample_with_logprobs(
                model,
                tokenizer,
                [p for p in chunk for _ in range(samples)],
                temperature=temperature,
                top_p=top_p,
                max_new_tokens=max_new_tokens,
                batch_size=len(chunk) * samples,
            ).completion_ids
        else:
            ids = greedy(cast("PreTrainedModel", model), tokenizer, chunk, max_new_tokens)  # None only with a server
        # one sequence of ids decodes to one str
        texts = [cast(str, tokenizer.decode(c, skip_special_tokens=True)) for c in ids]
        batch = [texts[i * samples : (i + 1) * samples] for i in range(len(chunk))]
        out += batch
        if on_batch is not None:
            on_batch(start, batch, sum(len(c) for c in ids))
    return out


# --------------------------------------------------------------------------- one model on one set


class EvalProgress:
    """What an evaluation shows while it runs: metrics.jsonl / progress.json, the rlt_eval_* metrics, a bar."""

    def __init__(self, ctx: StageContext, label: str, questions: int):
        from tqdm.auto import tqdm  # type: ignore[import-untyped]  # tqdm ships no type information

        self.ctx, self.label = ctx, label
        self.recorder = Recorder(ctx, "evaluate", questions)
        self.recorder.eval_model = label  # rlt_eval_accuracy/<label> in experiment tracking
        self.bar = tqdm(
            total=questions, desc=f"evaluate {label}", unit="q", disable=not (ctx.show_progress and ctx.is_main)
        )
        self.started = time.perf_counter()
        self.tokens = 0

    def batch(self, graded: Sequence[QuestionResult], batch: Sequence[QuestionResult], tokens: int) -> None:
        """After a batch: `graded` is every question graded so far, `batch` the new ones."""
        self.tokens += tokens
        acc = pass_at_1([[a.correct for a in q.answers] for q in graded])
        elapsed = time.perf_counter() - self.started
        self.recorder.record(
            len(graded),
            {
                "accuracy": acc,
                "generated_tokens": tokens,
                "tokens_per_second": self.tokens / elapsed if elapsed > 0 else 0.0,
            },
        )
        if self.ctx.metrics:
            self.ctx.metrics.set(catalogue.EVAL_ACCURACY, acc, model=self.label)
            self.ctx.metrics.inc(catalogue.EVAL_QUESTIONS, len(batch), model=self.label)
            self.ctx.metrics.inc(catalogue.EVAL_ANSWERS, sum(len(q.answers) for q in batch), model=self.label)
        self.bar.update(len(batch))
        self.bar.set_postfix({"acc": f"{acc:.3f}"}, refresh=True)

    def close(self) -> float:
        """Seconds since the start."""
        self.bar.close()
        return time.perf_counter() - self.started


def answer_questions(
    ctx: StageContext, ref: ModelRef, rows: list[dict[str, Any]], st: EvaluateStage, on_batch: OnBatch
) -> None:
    """Generation: `st.samples` answers to every row in the student format, by `ref` in-process or by the vLLM
    server of stages.evaluate.generation; `on_batch(start, answers, tokens)` after each batch."""
    from rlt.data.models import load_model, load_tokenizer

    server = st.generation.server_url if st.generation.mode == "server" else None
    if st.generation.mode == "server" and not server:
        raise ValueError("stages.evaluate.generation.serverUrl: required when mode is server")
    tokenizer: PreTrainedTokenizerBase = load_tokenizer(ref, padding_side="left")
    model: PreTrainedModel | None = None if server else load_model(ref, ctx.compute_device)
    prompts = [  # tokenize=False: the chat as text
        cast(
            str,
            tokenizer.apply_chat_template(
                ctx.formatter.student_messages(r["question"], "", "")[:2], tokenize=False, add_generation_prompt=True
            ),
        )
        for r in rows
    ]
    generate_answers(model, tokenizer, prompts, st, server, on_batch)


def evaluate_model(
    ctx: StageContext,
    ref: ModelRef,
    label: str,
    evalset: EvalSet,
    out_dir: Path,
    settings: EvaluateStage | None = None,
) -> EvalReport | None:
    """Generate, grade, report, write: `ref` on every question of `evalset`, the files under out_dir. Each rank
    answers and grades its own share; rank 0 merges the graded questions in order, writes and returns the report
    (the other ranks return None)."""
    st = settings or ctx.spec.stages.evaluate
    rank, world, share = shard_rows(ctx, "evaluate", evalset.rows)
    rows = [r for _, r in share]
    tags = answer_tags(ctx.formatter)
    progress = EvalProgress(ctx, label, len(rows))
    graded: list[QuestionResult] = []

    def on_batch(start: int, batch: list[list[str]], tokens: int) -> None:
        new = [
            grade_question(r, outs, evalset.answer_type, tags)
            for r, outs in zip(rows[start : start + len(batch)], batch, strict=True)
        ]
        graded.extend(new)
        progress.batch(graded, new, tokens)

    answer_questions(ctx, ref, rows, st, on_batch)
    seconds = progress.close()
    merged = gather_shares([(i, q) for (i, _), q in zip(share, graded, strict=True)], rank, world, len(evalset.rows))
    if merged is None:
        return None
    report = build_report(label, ref.model, evalset, st, merged, seconds, progress.tokens)
    write_report(out_dir, report, merged)
    if ctx.metrics:
        ctx.metrics.set(catalogue.EVAL_ACCURACY, report.accuracy, model=label)
    return report


# --------------------------------------------------------------------------- writing


def markdown_table(reports: list[dict[str, Any]]) -> str:
    lines = ["| model | questions | samples | pass@1 | ± s.e. | correct / answers |", "|---|---|---|---|---|---|"]
    for r in reports:
        se = f"{r['stderr']:.3f}" if r.get("stderr") is not None else "—"
        lines.append(
            f"| {r['model']} | {r['questions']} | {r['samples']} | {r['accuracy']:.3f} | {se} | "
            f"{r['correct']} / {r['answers']} |"
        )
    return "\n".join(lines) + "\n"


def error_bars(reports: list[dict[str, Any]]) -> tuple[list[list[float]], str]:
    """The bars' error bars and what they are: the 95 % Wilson intervals when every report has one (`rlt compare`'s
    table gives them), else ± one standard error."""
    if reports and all(r.get("ci95") for r in reports):
        lower = [r["accuracy"] - r["ci95"][0] for r in reports]
        upper = [r["ci95"][1] - r["accuracy"] for r in reports]
        return [lower, upper], "error bars: 95 % Wilson interval"
    se = [r.get("stderr") or 0.0 for r in reports]
    return [se, se], "error bars: ± 1 standard error"


def plot_accuracy(reports: list[dict[str, Any]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(reports) + 2), 4))
    xs = range(len(reports))
    yerr, what = error_bars(reports)
    ax.bar(xs, [r["accuracy"] for r in reports], yerr=yerr, capsize=4, color="tab:blue")
    ax.set_xticks(list(xs), [r["model"] for r in reports])
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass@1 (mean over questions)")
    ax.set_xlabel(what, fontsize=8)
    ax.set_title(title, fontsize=10)
    for x, r in zip(xs, reports, strict=True):
        ax.text(x, r["accuracy"] + 0.02, f"{r['accuracy']:.2f}", ha="center", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out_dir: Path, report: EvalReport, results: Sequence[QuestionResult]) -> None:
    write_jsonl(out_dir / PER_QUESTION_FILE, (q.to_json() for q in results))
    doc = report.to_json()
    atomic_write_json(out_dir / REPORT_JSON, doc)
    atomic_write_text(out_dir / REPORT_MD, f"# Evaluation: {report.dataset}\n\n" + markdown_table([doc]))
    plot_accuracy([doc], out_dir / ACCURACY_PLOT, f"{report.dataset} ({report.answer_type})")


def read_results(out_dir: Path) -> list[QuestionResult]:
    """The graded questions an evaluation wrote (per_question.jsonl)."""
    return [QuestionResult.from_json(d) for d in read_jsonl(out_dir / PER_QUESTION_FILE)]


def read_report(out_dir: Path) -> EvalReport:
    return EvalReport.from_json(json.loads((out_dir / REPORT_JSON).read_text()))


def run_evaluate(ctx: StageContext) -> str:
    label, ref = eval_target(ctx)
    evalset = eval_set(ctx)
    out = ctx.layout.eval_dir
    report = evaluate_model(ctx, ref, label, evalset, out)
    if report is not None:  # rank 0
        print(markdown_table([report.to_json()]), end="", flush=True)
    Recorder(ctx, "evaluate", len(evalset.rows)).done()
    return str(out)
