"""benchmarks/comparison_power.py (issue 52): the seed count a fixed-design comparison needs gives both PASS at the
effect and FAIL at no effect their power, one seed fewer does not, and the false PASS rate is the per-contrast
one-sided level."""

import runpy

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
