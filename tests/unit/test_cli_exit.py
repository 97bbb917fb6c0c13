"""`rlt` ends its process with the command's exit code even while a library's daemon thread is inside a native torch
call: the interpreter's teardown would end such a thread through the C++ runtime (`terminate called without an
active exception`, SIGABRT, exit 134), and a trainer rank whose stage was done and recorded failed its Job (seen
in the multi-node pods test: the operator restarted a finished gang). The busy threads come from a sitecustomize
at the head of PYTHONPATH, as a library's would; the command is the real console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from suite_helpers import EXAMPLES, ROOT

HOOK = """
import atexit, os, sys, threading
import torch

a = torch.randn(1200, 1200)
busy = threading.Barrier(3)

def work():
    busy.wait()
    while True:
        a @ a  # torch releases the GIL inside: at the interpreter's teardown it takes it back

for _ in range(2):
    threading.Thread(target=work, daemon=True).start()
busy.wait()
print("hook: 2 daemon threads inside torch calls", file=sys.stderr, flush=True)
atexit.register(lambda: print("hook: atexit ran", file=sys.stderr, flush=True))
"""


def rlt(hook_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hook_dir), str(ROOT / "training"), str(ROOT / "operator")]),
        "OMP_NUM_THREADS": "1",
    }
    rlt_script = Path(sys.executable).parent / "rlt"
    return subprocess.run([str(rlt_script), *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("valid", [True, False], ids=["valid", "invalid"])
def test_the_exit_code_is_the_commands_while_daemon_threads_are_inside_torch_calls(tmp_path, valid):
    (tmp_path / "sitecustomize.py").write_text(HOOK)
    spec = EXAMPLES / "rltrun-tiny.yaml"
    if not valid:
        spec = tmp_path / "bad.yaml"
        spec.write_text("apiVersion: rlt.dev/v1alpha1\nkind: RLTRun\nmetadata: {name: x}\nspec: {method: nope}\n")
    done = rlt(tmp_path, "validate", str(spec))
    said = done.stdout + done.stderr
    assert "hook: 2 daemon threads inside torch calls" in done.stderr, said  # the hazard was really there
    assert "terminate called" not in said, said
    assert done.returncode == (0 if valid else 1), said
    # all of the command's output flushed
    assert ("rltrun-tiny.yaml: ok" in said) if valid else ("unknown teaching method 'nope'" in said), said
    assert "hook: atexit ran" in done.stderr, said  # atexit handlers still run (logging, multiprocessing, trackers)


DEFECT = """
import rlt.cli

def defect(path, args):
    raise RuntimeError("a defect inside the command")

rlt.cli.validate_file = defect
reported = sys.excepthook

def report(*exc):  # as torch.distributed's (the rank) and wandb's (the run failed) hooks do
    print("hook: excepthook saw " + exc[0].__name__, file=sys.stderr, flush=True)
    reported(*exc)

sys.excepthook = report
"""


def test_a_command_that_raises_exits_1_with_its_traceback_last_while_daemon_threads_are_inside_torch_calls(tmp_path):
    """A failing rank (an exception no command catches) went through the interpreter's teardown: exit 134 and, with
    faulthandler on, every thread's stack after the traceback, which pushed the exception out of the log tail the
    operator reads the pod's error line from (FallbackToLogsOnError)."""
    (tmp_path / "sitecustomize.py").write_text(HOOK + DEFECT)
    done = rlt(tmp_path, "validate", str(EXAMPLES / "rltrun-tiny.yaml"))
    said = done.stdout + done.stderr
    assert "hook: 2 daemon threads inside torch calls" in done.stderr, said
    assert "terminate called" not in said and "Fatal Python error" not in said, said
    assert done.returncode == 1, said
    lines = done.stderr.splitlines()
    assert "Traceback (most recent call last):" in lines, said
    assert "hook: excepthook saw RuntimeError" in lines, said  # the libraries' hooks still see the failure
    # the exception is the last thing said but the atexit handlers' lines: the tail the operator reads
    assert lines[-2:] == ["RuntimeError: a defect inside the command", "hook: atexit ran"], said
