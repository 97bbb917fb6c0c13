"""`rlt compare` refuses what it cannot do before it trains anything (the slow re-run refusal is in
tests/training/test_compare.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from suite_helpers import tiny_doc

from rlt.contract.exitcodes import ExitCode


def test_compare_without_held_out_data_stops_before_training(tmp_path):
    data = tmp_path / "word.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"What is {i} + 1?", "reasoning_trace": "add one", "solution": str(i + 1)}) + "\n"
            for i in range(8)
        )
    )
    doc = tiny_doc()
    doc["spec"]["dataset"] = {"source": str(data)}  # a file, no evalFraction: nothing held out
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = tmp_path / "results"
    res = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "compare", str(path), "--output-dir", str(out), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    # refused at the door now (the spec's evaluate has no held-out rows), as a configuration error
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert "spec.dataset.evalFraction: 0 leaves no held-out rows for stages.evaluate" in res.stderr
    assert "starting" not in res.stdout, res.stdout  # no stage ran
    assert not (out / "tiny" / "compare" / "rl_teacher").exists()
