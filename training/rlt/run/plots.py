"""PNG plots of a run from its metrics.jsonl: RL reward and components per step, SFT loss, RL step-time split."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rlt.data.jsonl import read_jsonl

if TYPE_CHECKING:
    from matplotlib.axes import Axes

Row = dict[str, Any]  # one metrics.jsonl record: stage, step and the step's figures
# (metrics.jsonl key, legend label) or (key, label, "right"): a series drawn on an axis of its own
Series = tuple[str, ...]
Panel = tuple[str, list[Series]]  # a panel's title and its series


def read_metrics(path: Path) -> list[Row]:
    if not path.exists():
        return []
    return read_jsonl(path)


def latest_per_step(rows: list[Row], stage: str) -> list[Row]:
    """One row per step (a resumed run may log a step twice: keep the last)."""
    by_step = {r["step"]: r for r in rows if r["stage"] == stage}
    return [by_step[k] for k in sorted(by_step)]


def y_limits(values: Sequence[float | None], min_span: float = 0.1) -> tuple[float, float] | None:
    """Limits for an almost flat series: at least `min_span` (or 10 % of its size) around it, so that a change in
    the fifth decimal is not drawn as a climb over the whole axis. None: matplotlib's own limits are fine."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    lo, hi = min(finite), max(finite)
    span = max(min_span, 0.1 * max(abs(lo), abs(hi)))
    if hi - lo >= span:
        return None
    mid = (lo + hi) / 2
    return mid - span / 2, mid + span / 2


def _tidy(ax: Axes, ys: list[float]) -> None:
    """Steps are whole numbers; plain tick labels (no '+1e-5' offset); flat series keep a sensible height."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    limits = y_limits(ys)
    if limits is not None:
        ax.set_ylim(*limits)


RLT_PANELS: list[Panel] = [
    ("reward: student fit − λ × teacher/student gap − penalty", [("reward", "reward (mean over the step)")]),
    (
        "r_SS: how well the student predicts the solution after the explanation",
        [
            ("r_ss", "r_SS (mean + α·min)"),
            ("solution_logprob_mean", "mean log-prob of a solution token"),
            ("solution_logprob_min", "lowest log-prob of a solution token"),
        ],
    ),
    (
        "r_KL: how much likelier the explanation is for the teacher than for the student",
        [
            ("r_kl", "r_KL (mean + α·max)"),
            ("kl_mean", "mean teacher − student log-prob per token"),
            ("kl_max", "largest teacher − student log-prob"),
            ("kl_teacher_logprob", "teacher's mean log-prob of the explanation"),
            ("kl_student_ce", "student's cross-entropy on the explanation"),
        ],
    ),
    # GRPO's KL is orders of magnitude below the penalty: its own axis (right), or it draws as a flat zero
    ("format penalty and policy KL", [("format_penalty", "penalty"), ("kl", "GRPO KL (right axis)", "right")]),
]
# What the symbols of the panels mean, printed under the figure (docs/reward.md has the whole definition).
RLT_CAPTION = (
    "reward R = r_SS − λ·r_KL − penalty (λ: spec.stages.rl.reward.lambda, α: reward.alpha). "
    "log-prob: natural log of a token's probability (0 = certain). penalty: the explanation was not closed."
)
RCL_CAPTION = (
    "APG: accuracy gain from the guidance; NDR: share of questions the guidance did not make worse (docs/rcl.md)."
)
# method rcl: its reward has other parts (docs/rcl.md)
RCL_PANELS: list[Panel] = [
    ("reward (RCL: gain, losses ×degradationPenalty)", [("reward", "reward (mean over the step)")]),
    ("APG and NDR over the step's questions", [("rcl_apg", "APG"), ("rcl_ndr", "NDR")]),
    ("student accuracy", [("rcl_acc_with", "with guidance"), ("rcl_acc_without", "without")]),
    ("guidance", [("rcl_format_ok", "well-formed share"), ("kl", "GRPO KL (right axis)", "right")]),
]


def make_plots(metrics_file: Path, out_dir: Path, run_name: str = "", caveat: str | None = None) -> list[Path]:
    """Each figure is titled with the run and its stage; `caveat` (e.g. "a 135M model after 6 steps") is written
    on the figure itself, where a reader of the PNG alone sees it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_file)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    label = Label(run_name, caveat)

    rl = latest_per_step(rows, "rl")
    if rl:
        written.append(_reward_figure(plt, rl, out_dir / "rl_reward.png", label))
        written.append(_step_time_figure(plt, rl, out_dir / "rl_step_time.png", label))

    sft = latest_per_step(rows, "sft")
    if sft and any("loss" in r for r in sft):
        written.append(_sft_figure(plt, sft, out_dir / "sft_loss.png", label))
    return written


class Label:
    """A figure's title line (run and stage) and the footnotes under it (symbols, caveat)."""

    def __init__(self, run_name: str, caveat: str | None):
        self.run_name = run_name
        self.caveat = caveat

    def title(self, stage: str, what: str) -> str:
        return f"{self.run_name} · {stage}: {what}" if self.run_name else f"{stage}: {what}"

    def apply(self, fig: Any, stage: str, what: str, caption: str | None = None) -> None:
        import textwrap

        fig.suptitle(self.title(stage, what))
        # small type wrapped to the figure's width (about 17 characters an inch at 7.5 pt), one line each
        width = int(fig.get_figwidth() * 17)
        notes = [
            (line, note == caption) for note in (caption, self.caveat) if note for line in textwrap.wrap(note, width)
        ]
        fig.tight_layout(rect=(0, 0.012 + 0.03 * len(notes) * 7 / fig.get_figheight(), 1, 1))
        for i, (line, is_caption) in enumerate(reversed(notes)):
            y = (0.01 + 0.03 * i * 7 / fig.get_figheight()) if notes else 0
            fig.text(0.01, y, line, fontsize=7.5, color="dimgray" if is_caption else "darkred")


def _reward_figure(plt: ModuleType, rl: list[Row], path: Path, label: Label) -> Path:
    steps = [r["step"] for r in rl]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.4), sharex=True)
    rcl = any("rcl_apg" in r for r in rl)
    panels = RCL_PANELS if rcl else RLT_PANELS
    for ax, (title, series) in zip(axes.flat, panels, strict=False):
        _reward_panel(ax, title, series, rl, steps)
    for ax in axes[1]:
        ax.set_xlabel("RL step")
    label.apply(fig, "rl", "RCL reward per step" if rcl else "RLT reward per step", RCL_CAPTION if rcl else RLT_CAPTION)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _reward_panel(ax: Axes, title: str, series: list[Series], rl: list[Row], steps: list[int]) -> None:
    drawn: list[float] = []
    right: Axes | None = None
    right_drawn: list[float] = []
    for key, label, *side in series:
        ys: list[Any] = [r.get(key) for r in rl]  # a float, or None where a step lacks it (a gap in the line)
        if not any(y is not None for y in ys):
            continue
        if side:  # a series on a scale of its own
            right = right or ax.twinx()
            right.plot(steps, ys, marker="s", color="tab:red", label=label)
            right.set_ylabel(label.split(" (")[0], fontsize=8, color="tab:red")
            right_drawn += [y for y in ys if y is not None]
        else:
            ax.plot(steps, ys, marker="o", label=label)
            drawn += [y for y in ys if y is not None]
    if right is not None:
        _tidy(right, right_drawn)
    if title.startswith("reward") and all("reward_std" in r for r in rl):
        mean = [r["reward"] for r in rl]
        std = [r["reward_std"] for r in rl]
        ax.fill_between(
            steps,
            [m - s for m, s in zip(mean, std, strict=True)],
            [m + s for m, s in zip(mean, std, strict=True)],
            alpha=0.2,
            label="± std",
        )
        drawn += [m - s for m, s in zip(mean, std, strict=True)] + [m + s for m, s in zip(mean, std, strict=True)]
    _tidy(ax, drawn)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if right is not None:
        more = right.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    if handles:
        ax.legend(handles, labels, fontsize=8)


def _step_time_figure(plt: ModuleType, rl: list[Row], path: Path, label: Label) -> Path:
    steps = [r["step"] for r in rl]
    fig, ax = plt.subplots(figsize=(8, 4))
    bottom = [0.0] * len(rl)
    for phase in ("generate", "score", "update", "weight_sync"):
        ys = [r.get(f"seconds_{phase}", 0.0) for r in rl]
        if any(ys):
            ax.bar(steps, ys, bottom=bottom, label=phase)
            bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    _tidy(ax, bottom)
    ax.set_ylim(0, max(bottom, default=0.0) * 1.1 or 1.0)  # stacked bars start at 0, or the lower phases vanish
    ax.set_xlabel("RL step")
    ax.set_ylabel("seconds")
    if ax.get_legend_handles_labels()[0]:  # rows from before the phases were timed have none
        ax.legend()
    label.apply(fig, "rl", "step time by phase", "generate: rollouts; score: the reward; update: the optimiser step")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _sft_figure(plt: ModuleType, sft: list[Row], path: Path, label: Label) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    losses = [r["loss"] for r in sft if "loss" in r]
    ax.plot([r["step"] for r in sft if "loss" in r], losses, marker="o")
    _tidy(ax, losses)
    ax.set_xlabel("SFT step")
    ax.set_ylabel("loss (explanation tokens)")
    ax.grid(alpha=0.3)
    label.apply(fig, "sft", "warm-up loss", "cross-entropy of the teacher on the explanation tokens (nats per token)")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
