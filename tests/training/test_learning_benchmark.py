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
    assert set(teaching) == {"no explanation", "dataset trace", "SFT-only teacher", "RL teacher seed 3"}
    assert teaching["RL teacher seed 3"]["n"] == report["heldout_questions"] == 4
    assert teaching["SFT-only teacher"]["solution_logprob_mean"] < 0


def test_slope_interval_matches_known_values():
    mod = runpy.run_path(str(BENCH), run_name="not_main")
    b, half = mod["slope_ci"]([0.0, 1.0, 2.0, 3.0, 4.0])
    assert b == pytest.approx(1.0) and half == pytest.approx(0.0, abs=1e-12)
    b, half = mod["slope_ci"]([0.0, 2.0, 1.0, 3.0])  # slope 0.8, residual SS 1.8, s.e. sqrt(1.8/2/5), t(2) = 4.303
    assert b == pytest.approx(0.8) and half == pytest.approx(4.303 * 0.18**0.5, rel=1e-3)
    assert mod["t_quantile"](30) == pytest.approx(2.042, rel=0.002)
