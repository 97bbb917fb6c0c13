"""The reward's student reads question, explanation and solution in one chat. A RoPE model does not refuse positions
past its max_position_embeddings, it only stops meaning anything there, so `rlt validate` and `rlt run` refuse an
explanation limit that cannot fit the longest row's chat in the student's context, and say the limit that fits."""

from __future__ import annotations

import subprocess
import sys

import yaml
from suite_helpers import tiny_doc

from rlt.contract.exitcodes import ExitCode


def rlt(*args):
    return subprocess.run([sys.executable, "-m", "rlt.cli", *args], capture_output=True, text=True, timeout=300)


def write_run(tmp_path, rl_tokens: int, bad_rows: str = "reject"):
    doc = tiny_doc()
    doc["spec"]["stages"]["rl"]["maxCompletionLength"] = rl_tokens
    doc["spec"]["dataset"]["badRows"] = bad_rows
    path = tmp_path / f"run-{rl_tokens}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_validate_refuses_explanations_past_the_students_positions_and_says_what_fits(tmp_path, tiny):
    """`tiny` builds the model: its config (1024 positions) and tokenizer are on this machine."""
    res = rlt("validate", str(write_run(tmp_path, 1000)))
    assert res.returncode == 1, res.stdout + res.stderr
    line = next(x for x in res.stderr.splitlines() if "max_position_embeddings" in x)
    assert line.strip().startswith("spec.student.model: builtin:tiny-qwen2 reads 1024 positions"), line
    assert "spec.stages.rl.maxCompletionLength=1000" in line
    fits = int(line.split("to at most ")[1].split(",")[0])
    assert 0 < fits < 1000
    assert rlt("validate", str(write_run(tmp_path, fits))).returncode == 0
    res = rlt("validate", str(write_run(tmp_path, fits + 1)))
    assert res.returncode == 1 and "max_position_embeddings" in res.stderr, res.stderr


def test_run_stops_before_training_even_when_bad_rows_are_skipped(tmp_path, tiny):
    """No row can be left out to make the student's context longer: badRows: skip does not let the run go on."""
    path = write_run(tmp_path, 1000, bad_rows="skip")
    res = rlt("run", str(path), "--output-dir", str(tmp_path / "results"), "--no-progress", "--metrics-port", "-1")
    assert res.returncode == ExitCode.DATA_ERROR, res.stdout[-2000:] + res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "reads 1024 positions" in res.stderr
    assert "[sft] starting" not in res.stdout
