"""Teacher prompts longer than a stage's token limit: `rlt validate` names the file lines and the field to raise, and
`rlt run` stops with the same before any training (never TRL's `num_samples=0` traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml
from suite_helpers import tiny_doc

from rlt.contract.env import CACHE
from rlt.contract.exitcodes import ExitCode

LONG = "Count the apples in this long story. " + "There was one more apple on the table. " * 40


def write_run(tmp_path, rows):
    data = tmp_path / "word.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = tiny_doc()
    doc["spec"]["dataset"] = {"source": str(data)}
    doc["spec"]["stages"]["sft"]["maxLength"] = 256
    doc["spec"]["stages"]["rl"]["maxPromptLength"] = 256
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def rlt(*args, cwd=None, env=None):
    return subprocess.run(
        [sys.executable, "-m", "rlt.cli", *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )


def test_validate_names_the_lines_and_the_field_to_raise(tmp_path):
    from rlt.data.models import resolve_model_path

    resolve_model_path("builtin:tiny-qwen2")  # validate reads the tokenizer of a built model (not only in suite order)
    short = {"question": "What is 2 + 2?", "reasoning_trace": "add", "solution": "4"}
    long = {"question": LONG, "reasoning_trace": "count them", "solution": "41"}
    path = write_run(tmp_path, [short, long, short, long])
    res = rlt("validate", str(path))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    sft = next(line for line in lines if "spec.stages.sft.maxLength=256" in line)
    rl = next(line for line in lines if "spec.stages.rl.maxPromptLength=256" in line)
    for line in (sft, rl):
        assert "2 of 4 rows have a longer teacher prompt" in line and ": line 2, line 4;" in line, line
    assert "raise spec.stages.rl.maxPromptLength to at least" in rl
    need = int(rl.rsplit("at least ", 1)[1])
    assert need > 256
    # raising the limits as told satisfies them; what is left is the tiny student's context (1024 positions), which
    # the long rows' chats fill (tests/training/test_student_context.py): with no stage that scores, the file is valid
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["stages"]["rl"]["maxPromptLength"] = need
    doc["spec"]["stages"]["sft"]["maxLength"] = int(sft.rsplit("at least ", 1)[1])
    path.write_text(yaml.safe_dump(doc))
    res = rlt("validate", str(path))
    assert "have a longer teacher prompt" not in res.stderr and "reads 1024 positions" in res.stderr, res.stderr
    doc["spec"]["stages"]["rl"]["enabled"] = doc["spec"]["stages"]["distill"]["enabled"] = False
    path.write_text(yaml.safe_dump(doc))
    res = rlt("validate", str(path))
    assert res.returncode == 0, res.stderr


def test_run_stops_before_training_naming_the_lines(tmp_path):
    """On a machine where the built-in model is not made yet (a fresh cache): `rlt run` makes it before the check,
    which otherwise was skipped and left sft to refuse the first row alone."""
    long = {"question": LONG, "reasoning_trace": "count them", "solution": "41"}
    path = write_run(tmp_path, [long] * 4)
    fresh = {**os.environ, CACHE.name: str(tmp_path / "cache")}
    out = str(tmp_path / "results")
    res = rlt("run", str(path), "--output-dir", out, "--no-progress", "--metrics-port", "-1", env=fresh)
    assert res.returncode == ExitCode.DATA_ERROR, res.stdout[-2000:] + res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "num_samples" not in res.stderr
    assert "spec.stages.sft.maxLength=256" in res.stderr and "line 1, line 2, line 3, line 4" in res.stderr
    assert "[sft] starting" not in res.stdout


def test_validate_prints_no_library_deprecation_noise():
    """Checking trainerArgs builds TRL configs; transformers' FutureWarning about its own fields is not the user's."""
    from suite_helpers import EXAMPLES

    res = rlt("validate", str(EXAMPLES / "rltrun-lora-tracked.yaml"))
    assert res.returncode == 0, res.stderr
    assert "Warning" not in res.stderr and "warnings.warn" not in res.stderr, res.stderr
