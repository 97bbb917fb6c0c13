"""benchmarks/learning.py runs end to end at tiny settings (tiny Qwen2): SFT, RL per seed, held-out teaching
figures, the plot and the JSON report. Its numbers are not judged here; the full run is reported in docs."""

import json
import runpy
import sys

import pytest
from suite_helpers import ROOT

BENCH = ROOT / "benchmarks" / "learning.py"


@pytest.mark.slow
def test_learning_benchmark_quick_run_writes_plot_and_figures(tmp_path, monkeypatch):
    out = tmp_path / "learning"
    monkeypatch.setattr(
        sys,
        "argv",
        [str(BENCH), "--quick", "--model", "builtin:tiny-qwen2", "--seeds", "3", "--out", str(out), "--quiet"],
    )
    report = runpy.run_path(str(BENCH), run_name="not_main")["main"]()
    assert (out / "learning.png").stat().st_size > 10_000
    saved = json.loads((out / "learning.json").read_text())
    assert saved["curves"]["3"]["reward"]["per_step"] == report["curves"][3]["reward"]["per_step"]
    assert len(report["curves"][3]["reward"]["per_step"]) == 3  # one reward per RL step
    for key in ("reward", "r_ss", "r_kl"):
        c = report["curves"][3][key]
        assert c["slope_ci95"] > 0 and c["start"] == c["per_step"][0] and c["end"] == c["per_step"][-1]
    teaching = report["teaching"]
    assert set(teaching) == {"no explanation", "dataset trace", "SFT teacher", "RL teacher seed 3"}
    assert len(teaching["RL teacher seed 3"]["solution_logprob"]) == report["heldout_questions"] == 4
    assert max(teaching["SFT teacher"]["solution_logprob"]) < 0
    primary = report["comparison"]["solution_logprob"]
    lo, hi = primary["ci95"]
    assert lo <= primary["mean"] <= hi and set(primary["per_seed"]) == {3}
    assert report["verdict"] in {"RL teaches better", "RL teaches worse", "no difference", "inconclusive"}


def test_two_way_bootstrap_and_verdict_rule():
    proto = runpy.run_path(str(ROOT / "benchmarks" / "teaching_protocol.py"), run_name="not_main")
    boot, verdict = proto["two_way_bootstrap"], proto["verdict"]
    # constant differences: the interval collapses onto them
    assert boot([[0.3] * 5] * 3, resamples=200) == pytest.approx((0.3, 0.3, 0.3))
    # seed-level spread dominates: one seed at +1, two at -1 -> the interval reaches both signs
    mean, lo, hi = boot([[1.0] * 20, [-1.0] * 20, [-1.0] * 20], resamples=2000)
    assert mean == pytest.approx(-1 / 3) and lo == pytest.approx(-1.0) and hi == pytest.approx(1.0)
    # question-level noise only: the interval is about ±1.96·sd/sqrt(n_seeds·n_questions) wide
    import numpy as np

    d = np.random.default_rng(1).normal(0.2, 1.0, size=(3, 200))
    mean, lo, hi = boot(d.tolist(), resamples=2000)
    assert lo < mean < hi and 0.1 < (hi - lo) / 2 < 0.2 and lo > 0
    assert verdict(0.01, 0.3) == "RL teaches better"
    assert verdict(-0.3, -0.01) == "RL teaches worse"
    assert verdict(-0.05, 0.08) == "no difference"
    assert verdict(-0.05, 0.2) == "inconclusive"
    assert proto["bare_leak"]("What is 23 + 45?", "The answer is 68.", "68") == 1.0
    assert proto["bare_leak"]("What is 23 + 45?", "20 + 40 = 60, 3 + 5 = 8, 68.", "68") == 0.0
    assert proto["bare_leak"]("What is 23 + 45?", "It is 67.", "68") == 0.0


def test_slope_interval_matches_known_values():
    mod = runpy.run_path(str(BENCH), run_name="not_main")
    b, half = mod["slope_ci"]([0.0, 1.0, 2.0, 3.0, 4.0])
    assert b == pytest.approx(1.0) and half == pytest.approx(0.0, abs=1e-12)
    b, half = mod["slope_ci"]([0.0, 2.0, 1.0, 3.0])  # slope 0.8, residual SS 1.8, s.e. sqrt(1.8/2/5), t(2) = 4.303
    assert b == pytest.approx(0.8) and half == pytest.approx(4.303 * 0.18**0.5, rel=1e-3)
    assert mod["t_quantile"](30) == pytest.approx(2.042, rel=0.002)


@pytest.mark.slow
def test_rl_temperature_flag_reaches_the_generator_and_search_row(tmp_path, monkeypatch):
    """--temperature is the rl stage's own temperature: the real RL run samples with it (a recording wrapper around
    the real sampler sees it) and the policy entropy TRL logs follows it; the settings-search row records it with
    the zero-advantage share."""
    import rlt.stages.rl as rl_stage

    seen: list[float] = []
    real = rl_stage.sample_with_logprobs

    def recording(*args, **kwargs):  # records, then calls the real sampler
        seen.append(kwargs["temperature"])
        return real(*args, **kwargs)

    monkeypatch.setattr(rl_stage, "sample_with_logprobs", recording)
    main = runpy.run_path(str(BENCH), run_name="not_main")["main"]
    base = ["--quick", "--model", "builtin:tiny-qwen2", "--out", str(tmp_path), "--quiet"]
    main([*base, "--sft-only"])
    rows = {}
    for tag, tau in (("cold", 0.3), ("hot", 3.0)):
        seen.clear()
        main([*base, "--rl-seed", "5", f"--tag=-{tag}", "--temperature", str(tau)])
        assert seen and set(seen) == {tau}
        rows[tag] = json.loads((tmp_path / "search.jsonl").read_text().splitlines()[-1])
        assert rows[tag]["temperature"] == tau and rows[tag]["run"] == f"learning-seed5-{tag}"
        assert 0.0 <= rows[tag]["zero_advantage"] <= 1.0 and rows[tag]["seconds"] > 0
        steps = [json.loads(x) for x in (tmp_path / f"learning-seed5-{tag}" / "metrics.jsonl").read_text().splitlines()]
        # TRL's share of equal-reward groups is recorded per step (the search's zero-advantage figure comes from it)
        assert all(0.0 <= r["frac_reward_zero_std"] <= 1.0 for r in steps if r["stage"] == "rl")
    assert rows["hot"]["entropy"] > rows["cold"]["entropy"] + 1.0  # measured 6.2 vs 4.5 nats (random tiny model)
    table = runpy.run_path(str(BENCH), run_name="not_main")["search_table"]([str(tmp_path / "search.jsonl")])
    assert [line.split(" | ")[0] for line in table.splitlines()[2:]] == [
        "| learning-seed5-cold",
        "| learning-seed5-hot",
    ]


def test_heldout_evaluation_uses_the_picked_device(monkeypatch):
    """learning.py's held-out evaluation loads its models on the machine's device (a GPU when there is one), not on a
    hard-wired CPU: the loader must get no device, or the one pick_device chose."""
    from rlt.data import models

    mod = runpy.run_path(str(BENCH), run_name="not_main")
    monkeypatch.setattr(models, "pick_device", lambda: "cuda:7")

    class Loaded(Exception):
        pass

    def load_model(ref, device=None, trainable=False):
        raise Loaded(device or models.pick_device())

    monkeypatch.setattr(models, "load_model", load_model)
    args = type("A", (), {"model": "builtin:tiny-qwen2"})()
    with pytest.raises(Loaded) as got:
        mod["teaching_figures"](args, {}, [{"question": "q", "solution": "1", "reasoning_trace": "t"}])
    assert str(got.value) == "cuda:7"


def test_compare_gives_the_seed_level_interval_and_power_and_k_is_at_least_4(capsys):
    proto = runpy.run_path(str(ROOT / "benchmarks" / "teaching_protocol.py"), run_name="not_main")
    sft = {"m": [0.0, 0.0, 0.0]}
    rl = {1: {"m": [1.0, 1.2, 0.8]}, 2: {"m": [0.0, 0.2, -0.2]}, 3: {"m": [0.5, 0.5, 0.5]}}
    c = proto["compare"](sft, rl, ("m",))["m"]
    d, lo, hi = c["seed_t"]  # seed means 1.0, 0.0, 0.5: mean 0.5, sd 0.5, t(2) 4.303
    assert d == pytest.approx(0.5) and hi - d == pytest.approx(4.303 * 0.5 / 3**0.5, rel=1e-3) and lo < 0
    assert len(c["power"]) == 3 and "seeds per arm" in c["power"][0]
    mod = runpy.run_path(str(BENCH), run_name="not_main")
    with pytest.raises(SystemExit, match="K ≥ 4"):
        mod["main"](["--samples", "2", "--out", "/nonexistent"])
