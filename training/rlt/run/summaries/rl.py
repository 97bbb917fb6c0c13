"""The rl stage's part of `rlt run`'s summary: its steps and the reward of each."""

from __future__ import annotations

import statistics
from typing import Any

from rlt.contract.layout import RunLayout
from rlt.run.plots import latest_per_step


def summarize(layout: RunLayout, metrics: list[dict[str, Any]]) -> dict[str, Any] | None:
    rows = latest_per_step(metrics, "rl")  # a resumed run may log a step twice: the last counts
    if not rows:
        return None
    return {
        "steps": len(rows),
        "rewardPerStep": [round(r.get("reward", float("nan")), 4) for r in rows],
        "rewardFirst": rows[0].get("reward"),
        "rewardLast": rows[-1].get("reward"),
        "meanStepSeconds": statistics.mean(r.get("step_seconds", 0.0) for r in rows),
    }


def lines(part: dict[str, Any]) -> list[str]:
    rewards = ", ".join(f"{r:.3f}" for r in part["rewardPerStep"])
    return [f"  reward per RL step: {rewards}"]
