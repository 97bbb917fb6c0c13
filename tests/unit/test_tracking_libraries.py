"""A training process does not import the tracking libraries its run does not report to: TRL (its profiling module)
and DeepSpeed (its autotuner) import W&B and MLflow whenever they are installed, seconds of every process's start.
The libraries a run does report to stay importable, and a caller that imports `rlt.cli.main` keeps its modules."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from suite_helpers import ROOT, tiny_doc

from rlt.cli import main
from rlt.contract.exitcodes import ExitCode
from rlt.spec.loading import parse_run
from rlt.stages.tracking import hide_unused_tracking_libraries

ENV = {"PYTHONPATH": f"{ROOT / 'training'}:{ROOT / 'operator'}", "PATH": "/usr/bin:/bin"}

# Hide for a run's spec, then ask the libraries' own availability checks (transformers', which TRL uses) and import
# TRL's profiling module, the one that imports both when they are available.
HIDE_AND_ASK = """
import json, sys
from rlt.spec.loading import parse_run
from rlt.stages.tracking import hide_unused_tracking_libraries
hidden = hide_unused_tracking_libraries(parse_run(json.loads(sys.argv[1])))
from transformers.integrations import is_mlflow_available, is_wandb_available
import trl.extras.profiling
def imports(name):
    try:
        __import__(name)
        return True
    except ImportError:
        return False
print(json.dumps({"hidden": hidden, "available": {"wandb": is_wandb_available(), "mlflow": is_mlflow_available()},
                  "imports": {"wandb": imports("wandb"), "mlflow": imports("mlflow")}}))
"""


def hide_for(tracking: dict) -> dict:
    doc = tiny_doc()
    doc["spec"]["tracking"] = tracking
    done = subprocess.run(
        [sys.executable, "-c", HIDE_AND_ASK, json.dumps(doc)], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_run_without_tracking_hides_both_and_trl_still_imports():
    seen = hide_for({})
    assert seen["hidden"] == ["wandb", "mlflow"]
    assert seen["available"] == {"wandb": False, "mlflow": False}
    assert seen["imports"] == {"wandb": False, "mlflow": False}


def test_the_library_a_run_reports_to_stays():
    seen = hide_for({"mlflow": {}})
    assert seen["hidden"] == ["wandb"]
    assert seen["available"] == {"wandb": False, "mlflow": True}
    assert seen["imports"] == {"wandb": False, "mlflow": True}
    doc = tiny_doc()
    doc["spec"]["tracking"] = {"wandb": {"project": "p", "mode": "offline"}, "mlflow": {}, "tensorboard": True}
    held = dict(sys.modules)
    try:  # in this process: a run that reports to both hides nothing (restored should it hide)
        assert hide_unused_tracking_libraries(parse_run(doc)) == []
        assert {n: sys.modules.get(n, "absent") for n in ("wandb", "mlflow")} == {
            n: held.get(n, "absent") for n in ("wandb", "mlflow")
        }
    finally:
        for name in ("wandb", "mlflow"):
            if name in held:
                sys.modules[name] = held[name]
            else:
                sys.modules.pop(name, None)


def bad_data_run(tmp_path) -> str:
    """A run whose data check fails in `rlt stage` before any model loads (exit DATA_ERROR), after the hiding."""
    (tmp_path / "rows.jsonl").write_text(json.dumps({"question": "1+1?"}) + "\n")  # no solution column
    doc = tiny_doc()
    doc["spec"]["dataset"] = {"source": str(tmp_path / "rows.jsonl"), "evalFraction": 0.5}  # held-out rows: compare
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


# The command with the command line's arguments (as the pods start `rlt stage`); at exit, what the process holds
# for each name.
COMMAND_THEN_SHOW = """
import atexit, sys
atexit.register(lambda: print("held:", {n: sys.modules.get(n, "absent") is None for n in ("wandb", "mlflow")}))
from rlt.cli import main
raise SystemExit(main())
"""


@pytest.mark.parametrize("command", ["stage", "run", "compare"])
def test_rlt_stage_run_and_compare_hide_them_for_their_process(tmp_path, command):
    run = bad_data_run(tmp_path)
    args = {
        "stage": ["stage", "sft", "--config", run, "--root", str(tmp_path / "pvc")],
        "run": ["run", run, "--output-dir", str(tmp_path / "results"), "--metrics-port", "-1"],
        "compare": ["compare", run, "--output-dir", str(tmp_path / "results")],  # its students train with TRL
    }[command]
    done = subprocess.run(
        [sys.executable, "-c", COMMAND_THEN_SHOW, *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert done.returncode == ExitCode.DATA_ERROR, done.stderr[-3000:]
    assert "held: {'wandb': True, 'mlflow': True}" in done.stdout  # hidden: None in sys.modules


def test_a_caller_of_main_keeps_its_modules(tmp_path, capsys):
    run = bad_data_run(tmp_path)
    before = {n: sys.modules.get(n, "absent") for n in ("wandb", "mlflow")}
    assert main(["stage", "sft", "--config", run, "--root", str(tmp_path / "pvc")]) == ExitCode.DATA_ERROR
    assert {n: sys.modules.get(n, "absent") for n in ("wandb", "mlflow")} == before
    assert None not in before.values()


# A benchmark's unit process, as unit_runner starts it (the script as __main__, the command line's arguments).
SCRIPT_THEN_SHOW = """
import atexit, runpy, sys
atexit.register(lambda: print("held:", {n: sys.modules.get(n, "absent") is None for n in ("wandb", "mlflow")}))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_teaching_comparison_unit_process_hides_them(tmp_path):
    """The comparison's units (hours of CPU each, two to five stages in one process) report to no tracker. A unit
    name the script refuses ends the process after the hiding, before any model loads."""
    script = ROOT / "benchmarks" / "teaching_comparison.py"
    args = [str(script), "--quick", "--out", str(tmp_path), "--unit", "nonsense.student1", "--seed", "1"]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT_THEN_SHOW, *args], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert done.returncode == 1 and "unit 'nonsense.student1'" in done.stderr, done.stderr[-3000:]
    assert "held: {'wandb': True, 'mlflow': True}" in done.stdout
