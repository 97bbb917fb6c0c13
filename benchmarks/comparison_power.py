"""The power table a fixed-design teaching comparison needs (issue 52), prepared before step 0's spread is known:
per primary contrast (RL teacher − raw traces, RL teacher − SFT-continued), d = pass@1 difference per seed, paired
t interval at level 1 − α/2 per contrast (Bonferroni over the two contrasts, α = 0.05); PASS when its lower end is
above 0, FAIL when its upper end is below the margin. The seeds needed so that PASS at a true d of `effect` and FAIL
at a true d of 0 each have probability ≥ `power`, and the simulated rates of the rule at that count.

  python benchmarks/comparison_power.py                         # the table over plausible seed spreads
  python benchmarks/comparison_power.py --sd 0.07 --seeds 8      # one spread, one seed count

Nothing here is a registered design: the comparison's seed count is fixed from step 0's measured spread, in a commit
before any comparison unit (docs/experiments.md, "Round five").
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import teaching_protocol as protocol

CONTRASTS = 2  # RL − raw (the paper's), RL − SFT-continued (the method's)
ALPHA = 0.05 / CONTRASTS  # Bonferroni: each contrast's two-sided interval at 97.5 %
EFFECT = MARGIN = 0.10
POWER = 0.85


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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--sd", type=float, action="append", help="seed spread(s) of d (default: a range)")
    p.add_argument("--seeds", type=int, help="a fixed seed count instead of the one each spread needs")
    p.add_argument("--reps", type=int, default=20_000)
    args = p.parse_args(argv)
    print("\n".join(table(args.sd or [0.03, 0.05, 0.07, 0.09, 0.12, 0.15], args.seeds, args.reps)))


if __name__ == "__main__":
    main()
