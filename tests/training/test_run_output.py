"""What a researcher's terminal shows during `rlt run`: rlt's own lines and progress bars, not library or
multi-process debugging noise."""

from __future__ import annotations

import subprocess
import sys

import pytest
from suite_helpers import TINY, tiny_doc

pytestmark = pytest.mark.slow


def test_a_local_run_prints_no_debug_or_library_noise(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "run", str(TINY), "--output-dir", str(tmp_path), "--stage", "sft"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "RLT_METRICS_PORT": "-1"},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout + res.stderr
    assert "[sft] done in" in out
    for noise in ("rlt-world", "rlt-shard", "Setting accelerator to CPU", "FutureWarning"):
        assert noise not in out, (noise, out[-3000:])


def test_a_local_distill_prints_no_trace_lines_unless_asked(tmp_path):
    """The distill stage's per-rank lines (rlt-world, rlt-shard, rlt-distill-written) are for pods and multi-process
    runs; a single local `rlt run` shows them only with RLT_TRACE=1 (docs/operator.md, the environment table)."""
    import yaml

    doc = tiny_doc()
    st = doc["spec"]["stages"]
    st["sft"], st["rl"]["enabled"] = {"enabled": False}, False  # distill from the base teacher: no training first
    st["distill"].update(limit=4, batchSize=2, samplesPerQuestion=2, maxNewTokens=8)
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump(doc))
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RLT_TRACE", "RLT_STAGE")}
    cmd = [sys.executable, "-m", "rlt.cli", "run", str(spec), "--output-dir", str(tmp_path / "out")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**env, "RLT_METRICS_PORT": "-1"})
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout + res.stderr
    assert "[distill] done in" in out, out[-3000:]
    for trace in ("rlt-world", "rlt-shard", "rlt-distill-written"):
        assert trace not in out, (trace, out[-3000:])


def test_trace_lines_follow_rlt_trace_in_a_single_local_process(monkeypatch, capsys):
    from rlt.stages.record import trace_line

    for name in ("RLT_TRACE", "RLT_STAGE", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    trace_line("rlt-shard stage=distill rank=0 rows=0")
    monkeypatch.setenv("RLT_TRACE", "1")
    trace_line("rlt-shard stage=distill rank=0 rows=1")
    assert capsys.readouterr().out == "rlt-shard stage=distill rank=0 rows=1\n"
