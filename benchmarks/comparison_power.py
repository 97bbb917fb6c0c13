"""The power table a fixed-design teaching comparison needs (issue 52), prepared before step 0's spread is known:
per primary contrast (RL teacher − raw traces, RL teacher − SFT-continued), d = pass@1 difference per seed, paired
t interval at level 1 − α/2 per contrast (Bonferroni over the two contrasts, α = 0.05); PASS when its lower end is
above 0, FAIL when its upper end is below the margin. The seeds needed so that PASS at a true d of `effect` and FAIL
at a true d of 0 each have probability ≥ `power`, and the simulated rates of the rule at that count.

  python benchmarks/comparison_power.py                         # the table over plausible seed spreads
  python benchmarks/comparison_power.py --sd 0.07 --seeds 8      # one spread, one seed count
  python benchmarks/comparison_power.py --step0                  # sized from step 0's measured student spread

--step0 reads step 0's committed units (benchmarks/headroom-students.jsonl): the sd over student seeds of each arm's
distilled-student pass@1. An arm's value per teacher seed is the mean of K students (seeds paired across arms), so a
contrast's sd is sqrt(2 × sd_student² / K + sd_teacher²); per K the teacher seeds the rule needs and the CPU hours.

Nothing here is a registered design: the comparison's seed count is fixed from step 0's measured spread, in a commit
before any comparison unit (docs/experiments.md, "Round five").
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import teaching_protocol as protocol

CONTRASTS = 2  # RL − raw (the paper's), RL − SFT-continued (the method's)
ALPHA = 0.05 / CONTRASTS  # Bonferroni: each contrast's two-sided interval at 97.5 %
EFFECT = MARGIN = 0.10
POWER = 0.85
STEP0_FILE = Path(__file__).parent / "headroom-students.jsonl"
PRIMARY_ARMS = 3  # rl, sft-continued, raw: what the two primary contrasts read
# A teacher seed's two teacher units on idle cores: the runner's estimates, rl 2 h and sft-continued 30 min
# (docs/experiments.md, "Fixed with the runner").
TEACHER_HOURS = 2.5
TEACHER_SD_PROBE = 0.05  # what the power falls to if teacher seeds spread this much on top (not yet measured)


def detectable(sd: float, n: int, power: float = POWER, alpha: float = ALPHA) -> float:
    """The true paired difference a two-sided level-alpha t interval over n seeds puts above 0 with `power` (the
    t approximation of teaching_protocol.detectable_effect, at any alpha). By symmetry it is also the margin below
    which the upper end falls with `power` when the true difference is 0."""
    df = n - 1
    return (protocol.t_ppf(1 - alpha / 2, df) + protocol.t_ppf(power, df)) * sd / math.sqrt(n)


def seeds_for(
    sd: float, effect: float = EFFECT, margin: float = MARGIN, power: float = POWER, reps: int = 20_000
) -> int:
    """Seeds so that PASS at `effect` and FAIL at 0 (below `margin`) each reach `power`: the t approximation's
    count, raised until the simulated rule reaches it too (the approximation is a little optimistic at few seeds)."""
    n = next((n for n in range(3, 200) if detectable(sd, n, power) <= min(effect, margin)), 200)
    while n < 200 and min(simulate(sd, n, effect, reps)["PASS"], simulate(sd, n, 0.0, reps)["FAIL"]) < power:
        n += 1
    return n


def simulate(sd: float, n: int, true_d: float, reps: int = 20_000, seed: int = 0) -> dict[str, float]:
    """Rates of PASS / FAIL / inconclusive for one contrast at a true paired difference, normal seeds."""
    rng = np.random.default_rng(seed)
    d = true_d + sd * rng.standard_normal((reps, n))
    m, s = d.mean(axis=1), d.std(axis=1, ddof=1)
    half = protocol.t_ppf(1 - ALPHA / 2, n - 1) * s / math.sqrt(n)
    passed, failed = m - half > 0, m + half < MARGIN
    return {"PASS": float(passed.mean()), "FAIL": float((failed & ~passed).mean())} | {
        "inconclusive": float((~passed & ~failed).mean())
    }


def table(sds: list[float], seeds: int | None = None, reps: int = 20_000) -> list[str]:
    lines = [
        f"per contrast: α {ALPHA:g} two-sided (Bonferroni over {CONTRASTS}), PASS: lower end > 0, FAIL: upper end < "
        f"{MARGIN}; power {POWER} wanted at a true d of {EFFECT} (PASS) and of 0 (FAIL)",
        "",
        "| sd of d over seeds | seeds | P(PASS), d = 0.10 | P(FAIL), d = 0 | P(PASS), d = 0 | P(FAIL), d = 0.10 |"
        " inconclusive, d = 0.05 |",
        "|---|---|---|---|---|---|---|",
    ]
    for sd in sds:
        n = seeds or seeds_for(sd, reps=reps)
        hi, lo, mid = simulate(sd, n, EFFECT, reps), simulate(sd, n, 0.0, reps), simulate(sd, n, EFFECT / 2, reps)
        lines.append(
            f"| {sd:g} | {n} | {hi['PASS']:.3f} | {lo['FAIL']:.3f} | {lo['PASS']:.3f} | {hi['FAIL']:.3f} | "
            f"{mid['inconclusive']:.3f} |"
        )
    return lines


def student_spreads(rows: list[dict]) -> dict[str, float]:
    """Each arm's sd over student seeds of distilled-student pass@1 (arms with two seeds or more)."""
    by_arm: dict[str, list[float]] = {}
    for r in rows:
        by_arm.setdefault(r["arm"], []).append(r["pass1"])
    return {a: statistics.stdev(v) for a, v in by_arm.items() if len(v) >= 2}


def sd_of_d(student_sd: float, students: int, teacher_sd: float = 0.0) -> float:
    """A contrast's sd over teacher seeds when each arm's value is the mean of `students` distilled students: both
    arms' student noise at `student_sd`, taken as independent (the pairing by student seed can only lower it), plus
    the teacher seeds' own spread (not measured before the comparison: 0 is the lower bound)."""
    return math.sqrt(2 * student_sd**2 / students + teacher_sd**2)


def step0_table(
    rows: list[dict], students: list[int], student_minutes: float, teacher_hours: float, reps: int
) -> list[str]:
    spreads = student_spreads(rows)
    if not spreads:
        raise SystemExit("--step0: no arm has two seeds in the units file yet")
    arm, worst = max(spreads.items(), key=lambda kv: kv[1])
    lines = [
        "step 0's sd over student seeds: "
        + ", ".join(f"{a} {v:.3f}" for a, v in sorted(spreads.items()))
        + f"; sized at the largest ({arm}) for every arm; the teacher seeds' own spread taken as 0 (a lower bound)",
        f"cost: {teacher_hours:g} h of teacher units and {PRIMARY_ARMS} arms × K students of {student_minutes:.1f} min"
        " per teacher seed (CPU, idle cores)",
        "",
        "| students per arm K | sd of d | teacher seeds | P(PASS), d = 0.10 | P(FAIL), d = 0 | student units |"
        f" CPU hours | P(PASS), P(FAIL) if the teacher sd is {TEACHER_SD_PROBE} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k in students:
        sd = sd_of_d(worst, k)
        n = seeds_for(sd, reps=reps)
        hi, lo = simulate(sd, n, EFFECT, reps), simulate(sd, n, 0.0, reps)
        units = n * PRIMARY_ARMS * k
        hours = n * teacher_hours + units * student_minutes / 60
        probe = sd_of_d(worst, k, TEACHER_SD_PROBE)
        p_hi, p_lo = simulate(probe, n, EFFECT, reps), simulate(probe, n, 0.0, reps)
        lines.append(
            f"| {k} | {sd:.3f} | {n} | {hi['PASS']:.3f} | {lo['FAIL']:.3f} | {units} | {hours:.0f} | "
            f"{p_hi['PASS']:.3f}, {p_lo['FAIL']:.3f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--sd", type=float, action="append", help="seed spread(s) of d (default: a range)")
    p.add_argument("--seeds", type=int, help="a fixed seed count instead of the one each spread needs")
    p.add_argument("--reps", type=int, default=20_000)
    p.add_argument("--step0", nargs="?", const=STEP0_FILE, type=Path, help="size from step 0's units file")
    p.add_argument("--students", type=int, action="append", help="students per arm (with --step0; default 1 2 4 8)")
    p.add_argument("--student-minutes", type=float, help="one student unit (default: step 0's fastest)")
    p.add_argument("--teacher-hours", type=float, default=TEACHER_HOURS)
    args = p.parse_args(argv)
    if args.step0:
        rows = [json.loads(line) for line in args.step0.read_text().splitlines() if line.strip()]
        minutes = args.student_minutes or min(r["seconds"] for r in rows) / 60
        print("\n".join(step0_table(rows, args.students or [1, 2, 4, 8], minutes, args.teacher_hours, args.reps)))
        return
    print("\n".join(table(args.sd or [0.03, 0.05, 0.07, 0.09, 0.12, 0.15], args.seeds, args.reps)))


if __name__ == "__main__":
    main()
