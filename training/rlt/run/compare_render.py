"""The text and the plot of `rlt compare`'s report (report.md, correlation.png), apart from the runs that fill it
(rlt.run.compare) so that each module stays short."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

TEACHER_ARMS = ("rl_teacher", "sft_teacher")
UNTRAINED = "untrained"


def _fmt(x: float | None, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _ci(ci: list[float] | None) -> str:
    return "—" if not ci else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def _r(c: dict[str, Any]) -> str:
    return f"{_fmt(c['pearson'])} (n={c['n']}{', ' + c['reason'] if c.get('reason') else ''})"


def render_markdown(report: dict[str, Any]) -> str:
    u = report["untrained"]
    lines = [
        f"# Teaching efficacy: {report['run']}",
        "",
        f"Held-out: {report['evalQuestions']} questions from {report['evalSource']} ({report['answerType']} answers), "
        f"{report['evaluation']['samples']} samples each; taught: {report['taughtQuestions']} questions; "
        f"wall time {report['wallSeconds']:.0f} s.",
        "",
        "| student | distilled on | rows | mean RLT reward | held-out pass@1 | ± s.e. | 95 % CI (Wilson) | Δ vs untrained "
        "| taught-question pass@1 |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {UNTRAINED} | — | — | — | {_fmt(u['accuracy'])} | {_fmt(u['stderr'])} | {_ci(u.get('ci95'))} | — | "
        f"{_fmt(u['taughtAccuracy'])} |",
    ]
    for arm, a in report["arms"].items():
        rows = sum(v for k, v in a["studentRows"].items() if k != "dropped")
        lines.append(
            f"| {arm} | {a['description']} | {rows} | {_fmt(a['meanReward'])} | {_fmt(a['accuracy'])} | "
            f"{_fmt(a['stderr'])} | {_ci(a.get('ci95'))} | {a['gainOverUntrained']:+.3f} | "
            f"{_fmt(a['taughtAccuracy'])} |"
        )
    c = report["correlation"]
    lines += [
        "",
        "Pearson correlation between an explanation's RLT reward and the student's improvement on the question "
        "it taught (the paper reports 0.89 at its scale):",
        "",
        "| improvement measure | pooled | rl_teacher | sft_teacher |",
        "|---|---|---|---|",
        f"| taught-question pass@1 gain | {_r(c['accuracyGain']['pooled'])} | {_r(c['accuracyGain']['rl_teacher'])} | "
        f"{_r(c['accuracyGain']['sft_teacher'])} |",
        f"| solution log-prob gain | {_r(c['logprobGain']['pooled'])} | {_r(c['logprobGain']['rl_teacher'])} | "
        f"{_r(c['logprobGain']['sft_teacher'])} |",
    ]
    return "\n".join(lines) + "\n"


def plot_correlation(points: list[dict[str, Any]], correlation: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, measure, label in zip(
        axes, ("accuracyGain", "logprobGain"), ("taught-question pass@1 gain", "solution log-prob gain"), strict=False
    ):
        for arm, colour in zip(TEACHER_ARMS, ("tab:red", "tab:blue"), strict=True):
            mine = [p for p in points if p["arm"] == arm]
            ax.scatter([p["reward"] for p in mine], [p[measure] for p in mine], label=arm, color=colour, alpha=0.7)
        ax.set_xlabel("RLT reward of the explanation")
        ax.set_ylabel(label)
        ax.set_title(f"{label}: r = {_r(correlation[measure]['pooled'])}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
