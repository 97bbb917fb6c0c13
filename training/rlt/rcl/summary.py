"""APG, NDR and TES of a teaching evaluation (pure functions), shared by the evaluation (`rlt eval`) and the
reward's step figures.

Per problem: acc_without = share of correct student answers without guidance, acc_with = the same with the
teacher's guidance (mean over guidance samples), tokens = teaching tokens (guidance only, 0 when missing).
- APG = mean over problems of (acc_with − acc_without).
- NDR = 1 − share of problems the student had right without guidance (acc_without ≥ 0.5) and wrong with it
  (acc_with < 0.5).
- TES = APG per 100 teaching tokens = APG / (mean tokens / 100); undefined (NaN) when no token was taught.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

RIGHT = 0.5  # a problem counts as "right" when at least half of the student's answers are correct


def apg(problems: Sequence[tuple[float, float, float]]) -> float:
    return sum(w - b for b, w, _ in problems) / len(problems) if problems else float("nan")


def ndr(problems: Sequence[tuple[float, float, float]]) -> float:
    if not problems:
        return float("nan")
    degraded = sum(1 for b, w, _ in problems if b >= RIGHT and w < RIGHT)
    return 1.0 - degraded / len(problems)


def tes(apg_value: float, mean_tokens: float) -> float:
    return apg_value / (mean_tokens / 100.0) if mean_tokens > 0 else float("nan")


def summarize_problems(problems: Sequence[tuple[float, float, float]]) -> dict[str, float]:
    """(acc_without, acc_with, teaching tokens) per problem -> the report's numbers."""
    n = len(problems)
    tokens = sum(t for _, _, t in problems) / n if n else float("nan")
    a = apg(problems)
    return {
        "problems": n,
        "apg": a,
        "ndr": ndr(problems),
        "tes": tes(a, tokens),
        "acc_without": sum(b for b, _, _ in problems) / n if n else float("nan"),
        "acc_with": sum(w for _, w, _ in problems) / n if n else float("nan"),
        "teaching_tokens": tokens,
    }


def step_values(summary: Mapping[str, object]) -> dict[str, float]:
    """The summary's numbers under their metrics.jsonl keys (`rcl_<name>`, the keys of rlt.contract.metrics.RCL_GAUGES)."""
    from rlt.contract.metrics import RCL_GAUGES

    return {
        f"rcl_{k}": float(v)
        for k, v in summary.items()
        if f"rcl_{k}" in RCL_GAUGES and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


# --------------------------------------------------------------------------- running it
