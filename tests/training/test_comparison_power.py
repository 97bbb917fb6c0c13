"""benchmarks/comparison_power.py (issue 52): the seed count a fixed-design comparison needs gives both PASS at the
effect and FAIL at no effect their power, one seed fewer does not, and the false PASS rate is the per-contrast
one-sided level."""

import runpy

import numpy as np
import pytest
from suite_helpers import ROOT


@pytest.fixture(scope="module")
def cp():
    return runpy.run_path(str(ROOT / "benchmarks" / "comparison_power.py"), run_name="not_main")


@pytest.mark.parametrize("sd", [0.05, 0.09])
def test_the_seed_count_gives_both_verdicts_their_power(cp, sd):
    n = cp["seeds_for"](sd, reps=8000)
    at, fewer = (cp["simulate"](sd, k, cp["EFFECT"], 8000) for k in (n, n - 1))
    null, null_fewer = (cp["simulate"](sd, k, 0.0, 8000) for k in (n, n - 1))
    assert min(at["PASS"], null["FAIL"]) >= cp["POWER"]
    assert min(fewer["PASS"], null_fewer["FAIL"]) < cp["POWER"]
    assert null["PASS"] < cp["ALPHA"] / 2 + 0.006  # Bonferroni over the two contrasts: 1.25 % one-sided
    assert sum(at.values()) == pytest.approx(1.0)


def test_k_students_per_arm_divide_the_student_variance(cp):
    """sd_of_d against a simulation: per teacher seed, the rl arm's value is its teacher's effect plus the mean of K
    students' noise, the raw arm's the mean of K students' noise of its own."""
    rng = np.random.default_rng(1)
    student_sd, k, teacher_sd, n = 0.15, 4, 0.05, 200_000
    rl = teacher_sd * rng.standard_normal(n) + student_sd * rng.standard_normal((n, k)).mean(axis=1)
    raw = student_sd * rng.standard_normal((n, k)).mean(axis=1)
    assert float(np.std(rl - raw)) == pytest.approx(cp["sd_of_d"](student_sd, k, teacher_sd), rel=0.01)


def test_step0_sizes_every_arm_at_the_largest_student_spread(cp):
    rows = [{"arm": "raw", "pass1": p, "seconds": 900.0} for p in (0.3, 0.1, 0.2)]
    rows += [{"arm": "friendly", "pass1": p, "seconds": 600.0} for p in (0.97, 0.99)]
    spreads = cp["student_spreads"](rows)
    assert spreads["raw"] == pytest.approx(0.1) and spreads["friendly"] == pytest.approx(0.01414, rel=1e-3)
    row = cp["step0_table"](rows, [2], 15.0, 2.5, 4000)[-1].split(" | ")
    n = cp["seeds_for"](0.1, reps=4000)  # sqrt(2 × 0.1² / 2): the raw arm's spread, two students per arm
    assert row[1:3] == ["0.100", str(n)]
    assert row[5:7] == [str(n * 3 * 2), f"{n * 2.5 + n * 3 * 2 * 15.0 / 60:.0f}"]
