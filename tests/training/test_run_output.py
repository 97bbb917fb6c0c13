"""What a researcher's terminal shows during `rlt run`: rlt's own lines and progress bars, not library or
multi-process debugging noise."""

from __future__ import annotations

import subprocess
import sys

import pytest
from suite_helpers import TINY

pytestmark = pytest.mark.slow


def test_a_local_run_prints_no_debug_or_library_noise(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "run", str(TINY), "--output", str(tmp_path), "--stage", "sft"],
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
