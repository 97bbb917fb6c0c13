"""benchmarks/sanity.py (issue 36): the shuffled-reward control keeps each group's rewards and only reorders them,
question selection, the seed-level statistics and power calculation, the verdict rule; and a tiny end-to-end run."""

import json
import math
import runpy
import statistics
import subprocess
import sys

import numpy as np
import pytest
from suite_helpers import ROOT

BENCH = ROOT / "benchmarks" / "sanity.py"


@pytest.fixture(scope="module")
def sanity():
    return runpy.run_path(str(BENCH), run_name="not_main")


@pytest.fixture(scope="module")
def proto():
    return runpy.run_path(str(ROOT / "benchmarks" / "teaching_protocol.py"), run_name="not_main")


def test_permutation_stays_within_groups_and_changes_order(sanity):
    permute = sanity["permute_within_groups"]
    values = [float(i) for i in range(32)]  # 4 groups of 8, distinct values
    rng = np.random.default_rng(0)
    out = permute(values, 8, rng)
    for g in range(4):
        assert sorted(out[g * 8 : (g + 1) * 8]) == values[g * 8 : (g + 1) * 8]  # same values, same group
    assert out != values  # reordered (8! orders: the identity on all 4 groups is ~1e-18)
    with pytest.raises(ValueError, match="whole groups"):
        permute(values[:7], 8, rng)


def test_choose_prefers_the_band_nearest_half(sanity):
    choose = sanity["choose"]
    rates = [0.0, 0.5, 1.0, 0.33, 0.66, 0.9, 0.45]
    assert choose(rates, 3) == [1, 4, 6]  # in band, nearest 0.5: 0.5, 0.45, 0.66 (0.16 from it) before 0.33 (0.17)
    assert choose([0.0, 1.0, 0.2], 2) == [0, 2]  # none in band: nearest to it (0.2 at 0.1, then 0.0 at 0.3)
    assert sanity["wrong"]("Add: 50 + 10 = 60. Together: 60 + 8 = 68.", "68") is False
    assert sanity["wrong"]("Together: 60 + 8 = 67.", "68") is True
    assert sanity["wrong"]("no numbers", "68") is True


def test_sanity_verdict_rule(proto):
    v = proto["sanity_verdict"]
    assert v((0.5, 0.1, 0.9), (0.4, 0.05, 0.8)) == "PASS"
    assert v((0.5, -0.1, 0.9), (0.4, 0.05, 0.8)) == "inconclusive"  # start not beaten
    assert v((0.5, 0.1, 0.9), (0.4, -0.05, 0.8)) == "inconclusive"  # shuffled not beaten
    assert v((0.5, 0.1, 0.9), (0.0, -0.5, 0.5)) == "FAIL"  # real <= shuffled
    assert v((0.5, 0.1, 0.9), (-0.2, -0.6, 0.1)) == "FAIL"


def test_welch_interval_and_power(proto):
    welch, t_ppf = proto["welch_interval"], proto["t_ppf"]
    a, b = [1.0, 2.0, 3.0], [0.0, 0.5, 1.0]
    d, lo, hi = welch(a, b)
    # var/n: 1/3 and 0.25/3; Welch df = (5/12)^2 / ((1/3)^2/2 + (1/12)^2/2) = 2.94 -> 2, t = 4.303
    se = math.sqrt(1 / 3 + 0.25 / 3)
    assert d == pytest.approx(1.5) and hi - d == pytest.approx(4.303 * se, rel=1e-3) and lo == pytest.approx(2 * d - hi)
    with pytest.raises(ValueError, match="2 seeds"):
        welch([1.0], b)
    assert t_ppf(0.975, 10) == pytest.approx(2.228, rel=1e-3)
    assert t_ppf(0.8, 10) == pytest.approx(0.8791, rel=0.01)
    assert t_ppf(0.8, 1e9) == pytest.approx(0.8416, rel=1e-3)
    # the figures: sd 0.7 per seed, effect 0.46 -> ~24 seeds for 80 % power (one-sample, paired per seed)
    n = proto["seeds_needed"](0.7, 0.46, two_arms=False)
    assert 19 <= n <= 22  # normal approximation: (1.96 + 0.84)^2 (0.7 / 0.46)^2 = 18.2, t adds a few
    assert proto["seeds_needed"](0.7, 0.46) > 2 * n - 10  # two independent arms need about twice as many
    mde = proto["detectable_effect"](0.7, 3, two_arms=False)
    assert 2.0 < mde < 4.0  # the issue's ~2.3 nats with 3 seeds (t with 2 df makes it wider)
    lines = proto["power_lines"](0.7, [0.46])
    assert "seeds per arm" in lines[0]


def test_power_simulation_matches_the_formula(proto):
    """At the detectable effect the Welch interval excludes 0 in about 80 % of simulated experiments."""
    sd, n = 1.0, 8
    eff = proto["detectable_effect"](sd, n)
    rng = np.random.default_rng(3)
    hits = sum(
        proto["welch_interval"](list(rng.normal(eff, sd, n)), list(rng.normal(0, sd, n)))[1] > 0 for _ in range(2000)
    )
    assert 0.72 < hits / 2000 < 0.88
    # and under the null it excludes 0 (upwards) ~2.5 % of the time
    null = sum(
        proto["welch_interval"](list(rng.normal(0, sd, n)), list(rng.normal(0, sd, n)))[1] > 0 for _ in range(2000)
    )
    assert null / 2000 < 0.05


@pytest.mark.slow
def test_sanity_quick_run_end_to_end(tmp_path):
    out = tmp_path / "s"
    cmd = [sys.executable, str(BENCH), "--quick", "--model", "builtin:tiny-qwen2", "--start", "builtin:tiny-qwen2"]
    subprocess.run([*cmd, "--out", str(out), "--seeds", "1,2"], check=True, timeout=900)
    res = json.loads((out / "sanity.json").read_text())
    assert res["seeds"] == {"real": [1, 2], "shuffled": [1, 2], "sft": [1, 2]}
    assert res["verdict"] in {"PASS", "FAIL", "inconclusive"}
    start = json.loads((out / "start.json").read_text())
    assert start["detectable_effect_floor"] > 0 and len(start["chosen_rows"]) == 2
    units = [json.loads(line) for line in (out / "units.jsonl").read_text().splitlines()]
    assert [(u["arm"], u["seed"]) for u in units][:4] == [("real", 1), ("shuffled", 1), ("real", 2), ("shuffled", 2)]
    for u in units:
        assert len(u["measures"]["objective"]["reward"]) == 2 * 2  # questions x K
        assert statistics.fmean(u["measures"]["objective"]["reward"]) == pytest.approx(u["summary"]["objective_reward"])
    assert (out / "sanity.png").stat().st_size > 5_000
    # the shuffled arm really trained on permuted rewards: same seed, same first samples, different weights
    from safetensors.torch import load_file

    real = load_file(next((out / "sanity-real-seed1" / "rl" / "model").glob("*.safetensors")))
    shuffled = load_file(next((out / "sanity-shuffled-seed1" / "rl" / "model").glob("*.safetensors")))
    assert max((real[k] - shuffled[k]).abs().max().item() for k in real) > 0
