"""The distill stage's part of `rlt run`'s summary: the distillation dataset's rows and rewards."""

from __future__ import annotations

import statistics
from typing import Any

from rlt.contract.layout import RunLayout
from rlt.data.answers import extract_answer, normalize
from rlt.data.jsonl import read_jsonl


def reaches_solution(row: dict[str, Any]) -> bool:
    """Does the explanation end on the answer of the solution it was given (the last answer each states)?

    The teacher sees the solution, so a wrong final answer is the teacher's arithmetic, not the question's."""
    want = normalize(extract_answer(str(row.get("solution", ""))))
    return want is not None and normalize(extract_answer(str(row.get("reasoning_trace", "")))) == want


def summarize(layout: RunLayout, metrics: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not layout.distill_dataset.exists():
        return None
    data = read_jsonl(layout.distill_dataset)
    # rows the distill stage did not score (a dataset put there for the student stage alone) have no reward
    scored = [d for d in data if "reward" in d]
    candidates = [c for d in scored for c in d.get("candidate_rewards", [d["reward"]])]
    return {
        "rows": len(data),
        "path": str(layout.distill_dataset),
        # kept = the best candidate of each question (the dataset); candidates = every sample scored, which is
        # what progress.json's candidateRewardMean and the distill rows of metrics.jsonl average
        "keptRewardMean": statistics.mean(d["reward"] for d in scored) if scored else None,
        "candidateRewardMean": statistics.mean(candidates) if candidates else None,
        "closedFraction": sum(d["closed"] for d in scored) / len(scored) if scored else None,
        "closedRows": sum(bool(d.get("closed")) for d in scored),
        "scoredRows": len(scored),
        "reachesSolutionRows": sum(reaches_solution(d) for d in data),
    }


def lines(part: dict[str, Any]) -> list[str]:
    if part["keptRewardMean"] is None:
        return [f"  distillation dataset: {part['rows']} rows, not scored by the distill stage -> {part['path']}"]
    lines = [
        f"  distillation dataset: {part['rows']} rows, mean reward of the kept rows {part['keptRewardMean']:.3f} "
        f"(all candidates {part['candidateRewardMean']:.3f}) -> {part['path']}"
    ]
    if "reachesSolutionRows" in part:  # summaries written before these counts existed have only the above
        lines.append(
            f"    the explanation ends on the given solution's answer in {part['reachesSolutionRows']} of "
            f"{part['rows']} rows; {part['closedRows']} of {part['scoredRows']} explanations are closed "
            "(an unclosed one reached the token limit)"
        )
    return lines
