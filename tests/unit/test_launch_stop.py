"""`rlt launch`'s exit after its ranks stopped (rlt.cli.launch): STOPPED (a disruption) when the gang agreed on the
stop or this pod was signalled; the launcher's own failure when a rank only left on an error after the launcher's
own SIGTERM, as torchrun sends the other ranks of a pod after one of them was killed (a lost peer, a failure). Real
processes: `rlt launch` runs a stand-in launcher (a Python one-liner) that writes what rlt's ranks write."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlt.contract.exitcodes import ExitCode

RLT = str(Path(sys.executable).parent / "rlt")


def launcher(*lines: str, wait: bool = False) -> list[str]:
    """A stand-in launcher: its ranks' lines in the stop marker (rlt.stages.preemption.report_stop), then exit 1 as
    torchrun does after a rank's non-zero exit; with `wait`, first until a SIGTERM reaches it."""
    code = "import os, pathlib, signal, sys, time\n"
    if wait:
        code += "signal.signal(signal.SIGTERM, lambda *a: None)\nprint('ready', flush=True)\nsignal.pause()\n"
    for line in lines:
        code += f"open(os.environ['RLT_STOP_MARKER'], 'a').write({line!r} + '\\n')\n"
    code += "sys.exit(1)\n"
    return [RLT, "launch", "--", sys.executable, "-c", code]


@pytest.mark.parametrize(
    ("lines", "expect"),
    [
        (["rl 4 /c/checkpoint-4 agreed", "rl 4 /c/checkpoint-4 agreed"], ExitCode.STOPPED),  # a peer pod preempted
        (["rl 2 /c/checkpoint-2 after-error"], 1),  # torchrun tore the pod's ranks down after one was killed
        (["rl 2 /c/checkpoint-2 after-error", "rl 2 /c/checkpoint-2 agreed"], ExitCode.STOPPED),  # the gang agreed
        ([], 1),  # no rank stopped: the launcher's failure
    ],
)
def test_a_stop_is_a_disruption_only_when_agreed_or_signalled(lines, expect):
    done = subprocess.run(launcher(*lines), capture_output=True, text=True, timeout=120)
    assert done.returncode == expect, done.stderr
    if lines and expect == 1:
        assert "a rank stopped on an error after its launcher's signal" in done.stderr


def test_a_signalled_pod_whose_rank_left_on_an_error_stopped():
    """A drain: the pod's SIGTERM, forwarded; a rank leaves on an error after it (a peer pod gone first)."""
    proc = subprocess.Popen(
        launcher("rl 2 /c/checkpoint-2 after-error", wait=True),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitCode.STOPPED, err
