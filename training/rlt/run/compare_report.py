"""`rlt compare`'s report from typed records, pure: the interval and correlation helpers, one point per explanation
(its reward against the student's improvement on the question it taught), each arm's summary and report.json's
structure, then the files (`write_compare`). rlt.run.compare runs the arms that fill the records."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlt.contract.layout import (
    ACCURACY_PLOT,
    CORRELATION_PLOT,
    REPORT_JSON,
    REPORT_MD,
    RunLayout,
    atomic_write_json,
    atomic_write_text,
)
from rlt.data.jsonl import camel_json
from rlt.run.compare_render import TEACHER_ARMS, UNTRAINED, plot_correlation, render_markdown
from rlt.stages.evaluate import EvalReport, plot_accuracy

if TYPE_CHECKING:
    from rlt.data.eval_set import EvalSet
    from rlt.spec.run import RLTRun

ARMS = {
    "rl_teacher": "explanations of the RL teacher (sft → rl → distill)",
    "sft_teacher": "explanations of the SFT-only teacher (sft → distill)",
    "dataset_traces": "the dataset's own reasoning traces",
}


# --------------------------------------------------------------------------- pure helpers


def wilson_interval(p: float, n: int, z: float = 1.96) -> list[float] | None:
    """95 % Wilson score interval of a proportion `p` over `n` units; None without units. Called with the held-out
    questions as units (as ± s.e. is): a question's samples are not independent answers, and pooling them would
    narrow the interval by up to √samples. A question's mean accuracy counts as one observation, which errs wide."""
    if n <= 0:
        return None
    if not 0 <= p <= 1:
        raise ValueError(f"wilson_interval: p={p} is not a proportion")
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def pearson(xs: Sequence[float], ys: Sequence[float]) -> dict[str, Any]:
    """Pearson's r with n; r is None (and `reason` says why) when it is undefined."""
    import numpy as np

    n = len(xs)
    if n != len(ys):
        raise ValueError("pearson: xs and ys differ in length")
    if n < 3:
        return {"n": n, "pearson": None, "reason": "fewer than 3 points"}
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if x.std() == 0 or y.std() == 0:
        return {"n": n, "pearson": None, "reason": "one variable is constant"}
    return {"n": n, "pearson": float(np.corrcoef(x, y)[0, 1])}


# --------------------------------------------------------------------------- records and the report (pure)


@dataclass(frozen=True)
class Point:
    """One explanation a teacher wrote: its reward against the student's improvement on the question it taught."""

    arm: str
    source_row: int
    reward: float
    accuracy_gain: float  # taught-question pass@1 of the arm's student minus the untrained student's
    logprob_gain: float  # mean tempered log-prob of the solution given question + explanation, after − before

    def to_json(self) -> dict[str, Any]:
        return camel_json(self)


@dataclass(frozen=True)
class ArmResult:
    """What one arm produced: its distillation rows, what the student stage did with them, its two evaluations."""

    name: str
    distill_rows: list[dict[str, Any]]
    student_rows: dict[str, int]  # counts per action (kept, truncated, replaced, dropped)
    held_out: EvalReport
    taught: EvalReport
    layout: RunLayout
    student_model: Path


MEASURES = {"accuracyGain": "accuracy_gain", "logprobGain": "logprob_gain"}


def teaching_points(
    arm: str,
    rows: Sequence[dict[str, Any]],
    taught_after: dict[int, float],
    taught_before: dict[int, float],
    logprob_gains: Sequence[float],
) -> list[Point]:
    """A Point per distillation row, from per-question taught accuracies (after, before) and log-prob gains."""
    return [
        Point(arm, r["source_row"], r["reward"], taught_after[r["source_row"]] - taught_before[r["source_row"]], g)
        for r, g in zip(rows, logprob_gains, strict=True)
    ]


def correlations(points: Sequence[Point]) -> dict[str, dict[str, Any]]:
    """Per improvement measure: Pearson's r of reward against it, pooled and per teacher arm."""
    out: dict[str, dict[str, Any]] = {}
    for measure, field in MEASURES.items():
        out[measure] = {"pooled": pearson([p.reward for p in points], [getattr(p, field) for p in points])}
        for arm in TEACHER_ARMS:
            mine = [p for p in points if p.arm == arm]
            out[measure][arm] = pearson([p.reward for p in mine], [getattr(p, field) for p in mine])
    return out


def arm_summary(arm: ArmResult, untrained: EvalReport) -> dict[str, Any]:
    rewards = [r["reward"] for r in arm.distill_rows if r.get("reward") is not None]
    return {
        "description": ARMS[arm.name],
        "distillRows": len(arm.distill_rows),
        "studentRows": arm.student_rows,
        "meanReward": sum(rewards) / len(rewards) if rewards else None,
        "accuracy": arm.held_out.accuracy,
        "stderr": arm.held_out.stderr,
        "ci95": wilson_interval(arm.held_out.accuracy, arm.held_out.questions),
        "gainOverUntrained": arm.held_out.accuracy - untrained.accuracy,
        "taughtAccuracy": arm.taught.accuracy,
        "evalReport": str(arm.layout.eval_dir / REPORT_JSON),
        "taughtReport": str(arm.layout.taught_eval_dir / REPORT_JSON),
        "studentModel": str(arm.student_model),
    }


def build_report(
    run: RLTRun,
    taught: Sequence[dict[str, Any]],
    evalset: EvalSet,
    untrained: tuple[EvalReport, EvalReport, RunLayout],
    arms: Sequence[ArmResult],
    points: Sequence[Point],
    seconds: float,
) -> dict[str, Any]:
    """report.json: every number read from the records given (`untrained` = held-out report, taught report, its
    layout)."""
    held_out, taught_report, untrained_layout = untrained
    return {
        "run": run.name,
        "wallSeconds": round(seconds, 1),
        "taughtQuestions": len(taught),
        "taughtRows": [r["source_row"] for r in taught],
        "evalQuestions": len(evalset.rows),
        "evalSource": evalset.source,
        "answerType": evalset.answer_type,
        "studentBudget": run.spec.stages.student.model_dump(mode="json", by_alias=True, exclude_none=True),
        "evaluation": run.spec.stages.evaluate.model_dump(mode="json", by_alias=True, exclude_none=True),
        "untrained": {
            "accuracy": held_out.accuracy,
            "stderr": held_out.stderr,
            "ci95": wilson_interval(held_out.accuracy, held_out.questions),
            "taughtAccuracy": taught_report.accuracy,
            "evalReport": str(untrained_layout.eval_dir / REPORT_JSON),
        },
        "arms": {a.name: arm_summary(a, held_out) for a in arms},
        "correlation": correlations(points),
        "points": [p.to_json() for p in points],
    }


def write_compare(root: Path, report: dict[str, Any]) -> None:
    """report.json, report.md, accuracy.png and correlation.png under the compare folder."""
    atomic_write_json(root / REPORT_JSON, report)
    atomic_write_text(root / REPORT_MD, render_markdown(report))
    reports = [{"model": UNTRAINED, **report["untrained"]}] + [{"model": a, **v} for a, v in report["arms"].items()]
    plot_accuracy(
        reports,
        root / ACCURACY_PLOT,
        f"held-out pass@1: {report['evalQuestions']} questions × {report['evaluation']['samples']} samples",
    )
    plot_correlation(report["points"], report["correlation"], root / CORRELATION_PLOT)
