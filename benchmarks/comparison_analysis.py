"""The teaching comparison's analysis (docs/experiments.md, "Round five: the comparison's fixed design"): each arm's
value per teacher seed is the mean held-out pass@1 of its K students; two primary contrasts per teacher seed,
d_raw = rl − raw and d_sft = rl − sft-continued, each read with a paired two-sided t interval over the teacher seeds
at 1 − ALPHA (97.5 %: Bonferroni over the two); PASS when its lower end is above 0, FAIL when its upper end is below
MARGIN (0.10), otherwise inconclusive. The rule's α and margin are comparison_power's (one source of truth)."""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import comparison_power as power
import teaching_protocol as protocol

ALPHA, MARGIN = power.ALPHA, power.MARGIN  # per contrast: 0.025 two-sided, i.e. a 97.5 % interval
LEVEL = f"{100 * (1 - ALPHA):g} %"
SEEDS_FIXED = 15  # teacher seeds 1 … 15 (registered; no pilot)
STUDENTS = 4  # K students per arm and teacher seed (registered)
PRIMARY_ARMS = ("rl", "sft-continued", "raw")
CONTRASTS = {"d_raw": ("rl", "raw"), "d_sft": ("rl", "sft-continued")}  # name -> (a, b): a − b per teacher seed


def student_table(rows: list[dict], settings: str = "protocol") -> dict[int, dict[str, dict[int, float]]]:
    """teacher seed -> arm -> student index -> pass@1, from the student units run with `settings` (the teacher
    units carry no pass@1). A student measured twice is an error: a failed unit is re-run, never replaced."""
    table: dict[int, dict[str, dict[int, float]]] = {}
    for r in rows:
        if r.get("kind") != "student" or r.get("settings", "protocol") != settings:
            continue
        by_student = table.setdefault(r["seed"], {}).setdefault(r["arm"], {})
        if r["student"] in by_student:
            raise ValueError(f"teacher seed {r['seed']} {r['arm']} student {r['student']}: two rows")
        by_student[r["student"]] = r["pass1"]
    return table


def arm_values(table: dict[int, dict[str, dict[int, float]]], students: int = STUDENTS) -> dict[int, dict[str, float]]:
    """teacher seed -> arm -> mean pass@1 of its students 1 … `students`; an arm still missing one has no value."""
    return {
        seed: {
            arm: statistics.fmean(by[j] for j in range(1, students + 1))
            for arm, by in arms.items()
            if all(j in by for j in range(1, students + 1))
        }
        for seed, arms in sorted(table.items())
    }


def contrasts(values: dict[int, dict[str, float]], fixed: int = SEEDS_FIXED) -> dict[str, list[tuple[int, float]]]:
    """Per contrast, (teacher seed, a − b) for the seeds 1 … `fixed` that have all three primary arms' values (the
    same seeds in both contrasts), in seed order."""
    complete = [s for s in sorted(values) if 1 <= s <= fixed and all(a in values[s] for a in PRIMARY_ARMS)]
    return {name: [(s, values[s][a] - values[s][b]) for s in complete] for name, (a, b) in CONTRASTS.items()}


def interval(d: list[float], alpha: float = ALPHA) -> tuple[float, float, float]:
    """Mean of the paired differences and its two-sided t interval at 1 − alpha (nan ends below two seeds)."""
    if not d:
        return math.nan, math.nan, math.nan
    m = statistics.fmean(d)
    if len(d) < 2:
        return m, math.nan, math.nan
    half = protocol.t_ppf(1 - alpha / 2, len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
    return m, m - half, m + half


def rule(lo: float, hi: float) -> str:
    """The registered reading of one contrast's interval (PASS is read first)."""
    if lo > 0:
        return "PASS"
    if hi < MARGIN:
        return "FAIL"
    return "inconclusive"


def decide(d: list[float], fixed: int = SEEDS_FIXED) -> dict[str, Any]:
    """One contrast's verdict once all `fixed` teacher seeds are in; before that the interval is a description."""
    m, lo, hi = interval(d)
    verdict = rule(lo, hi) if len(d) >= fixed else f"not in ({len(d)} of {fixed} seeds)"
    return {"seeds": len(d), "d": [m, lo, hi], "verdict": verdict}


def verdicts(rows: list[dict], settings: str = "protocol", students: int = STUDENTS) -> dict[str, Any]:
    """The arm values, the per-seed contrasts and each contrast's verdict."""
    values = arm_values(student_table(rows, settings), students)
    per_seed = contrasts(values)
    return {
        "values": values,
        "contrasts": per_seed,
        "decisions": {name: decide([d for _, d in pairs]) for name, pairs in per_seed.items()},
    }


def analyse(rows: list[dict], plot: Path | None = None, settings: str = "protocol", students: int = STUDENTS) -> dict:
    res = verdicts(rows, settings, students)
    table = student_table(rows, settings)
    arms = [*PRIMARY_ARMS, *sorted({a for t in table.values() for a in t} - set(PRIMARY_ARMS))]
    print(f"each arm per teacher seed: the mean held-out pass@1 of its {students} students")
    print(f"| teacher seed | {' | '.join(arms)} | d_raw | d_sft |")
    print("|---|" + "---|" * (len(arms) + 2))
    diffs = {name: dict(pairs) for name, pairs in res["contrasts"].items()}
    for seed, by_arm in sorted(table.items()):
        cells = []
        for a in arms:
            got = len(by_arm.get(a, {}))
            value = res["values"][seed].get(a)
            cells.append(f"{value:.3f}" if value is not None else f"({got} of {students})" if got else "—")
        ds = [f"{diffs[n][seed]:+.3f}" if seed in diffs[n] else "—" for n in CONTRASTS]
        print(f"| {seed} | {' | '.join(cells)} | {' | '.join(ds)} |")
    for name, (a, b) in CONTRASTS.items():
        dec = res["decisions"][name]
        m, lo, hi = dec["d"]
        if not dec["seeds"]:
            shown = "no teacher seed with all three arms' students yet"
        elif dec["seeds"] < 2:
            shown = f"{m:+.3f} (one teacher seed: no interval)"
        else:
            shown = f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}] ({LEVEL} paired t, {dec['seeds']} teacher seeds)"
        print(f"{name} = {a} − {b}: {shown}; verdict (registered rule, margin {MARGIN}): {dec['verdict']}")
    if plot is not None and any(res["contrasts"].values()):
        draw(res, plot)
        print(f"plot: {plot}")
    return res


def draw(res: dict[str, Any], path: Path) -> None:
    """The per-seed contrasts: each teacher seed's d_raw and d_sft, each contrast's mean and interval, 0 and MARGIN."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for i, (name, (a, b)) in enumerate(CONTRASTS.items()):
        pairs = res["contrasts"][name]
        xs = [s + (i - 0.5) * 0.25 for s, _ in pairs]
        ax.plot(xs, [d for _, d in pairs], "o", alpha=0.7, color=f"C{i}", label=f"{name} = {a} − {b}")
        dec = res["decisions"][name]
        m, lo, hi = dec["d"]
        x = SEEDS_FIXED + 1.5 + i
        if math.isfinite(lo):
            ax.errorbar([x], [m], yerr=[[m - lo], [hi - m]], fmt="s", capsize=5, color=f"C{i}")
        elif math.isfinite(m):
            ax.plot([x], [m], "s", color=f"C{i}")
        where = (x, m if math.isfinite(m) else 0.0)
        ax.annotate(dec["verdict"], where, xytext=(8, 0), textcoords="offset points", fontsize=7, va="center")
    ax.axhline(0, color="k", lw=0.8)
    ax.axhline(MARGIN, color="grey", ls="--", lw=0.8, label=f"margin {MARGIN}")
    ticks = list(range(1, SEEDS_FIXED + 1))
    ax.set_xticks([*ticks, SEEDS_FIXED + 1.5, SEEDS_FIXED + 2.5], [*map(str, ticks), "d_raw", "d_sft"])
    ax.set_xlabel(f"teacher seed; right: each contrast's mean and {LEVEL} interval")
    ax.set_ylabel("pass@1 difference (mean of the students)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
