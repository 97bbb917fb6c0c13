"""`rlt launch -- LAUNCHER ...`: how a trainer pod runs its launcher (accelerate launch, torchrun).

The launcher is a child process that gets every SIGTERM/SIGINT this process gets (the kubelet signals only the
container's main process; the launcher forwards it to the ranks). A launcher exits 1 after a signal whatever its
ranks did, so the ranks say a stop in a file (rlt.stages.preemption.report_stop) and this command exits
`ExitCode.STOPPED` when the gang agreed on it, or when this pod was signalled: the operator then counts the stop as a
disruption. A rank that stopped on an error after a signal this pod never got was torn down by its launcher after
another rank failed (a lost peer): the launcher's failure stands. A rank that failed (an exception, or `rlt stage`'s
one-line config or data error) notes its line and exit code in another file (`note_failure`), and this command says
the first cause last: the launchers' own tracebacks and reports would push it out of the pod's termination message,
the log's last 2 KiB. A launcher exits 1 whatever its ranks' codes were, so a noted config or data error (FAIL_FAST)
becomes this command's code: the Job's podFailurePolicy fails the run instead of restarting the gang into it again.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType

from rlt.contract.env import FAILURE_NOTE, RANK
from rlt.contract.exitcodes import FAIL_FAST, ExitCode
from rlt.stages.preemption import STOP_AGREED, STOP_MARKER_ENV

# A noted line longer than this is cut: the termination message has 2 KiB for the launcher's report and this line.
NOTE_CHARS = 400
# A rank that lost its peer (gloo's closed connection, NCCL's aborted communicator) fails after the rank that caused
# it, which may have died with no Python error (an OOM kill): such a line is a victim's, not the cause. Only the
# collectives' own words: DistBackendError is any NCCL error (a full /dev/shm too), and a reset connection may be a
# generator's, both causes in their own right.
PEER_LOST = re.compile(
    r"connection closed by peer|DistNetworkError|remote process exited|communicator was aborted", re.IGNORECASE
)


def note_failure(line: str, code: int) -> None:
    """Tell `rlt launch`, when it runs this rank, why the rank fails: the line (its lines joined) and the exit code."""
    note = os.environ.get(FAILURE_NOTE.name)
    if not note:
        return
    # one line: a spec error's field lines are joined to its first (the pod's line must name the field)
    text = "; ".join(part.strip() for part in line.splitlines() if part.strip()) or "(no message)"
    text = text if len(text) <= NOTE_CHARS else text[: NOTE_CHARS - 3] + "..."
    # every failing rank of the pod appends its line; a note that cannot be written must not change how it fails
    with contextlib.suppress(Exception), Path(note).open("a", encoding="utf-8", errors="backslashreplace") as f:
        f.write(f"{int(code)}\trank {os.environ.get(RANK.name, '0')} failed: {text}\n")


def first_cause(noted: list[str]) -> tuple[int, str] | None:
    """(exit code, line) of the noted failure to report: the first that is not a lost peer's, else the first, said
    to be one. None when nothing was noted."""
    failures = [(int(code), text) for code, tab, text in (n.partition("\t") for n in noted) if tab and code.isdigit()]
    cause = next(((code, text) for code, text in failures if not PEER_LOST.search(text)), None)
    if cause or not failures:
        return cause
    code, text = failures[0]  # the label first: the operator cuts a long line's end
    return code, f"(perhaps a lost peer: see the launcher's report for the rank that failed first) {text}"


def launch(command: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="rlt-launch-") as tmp:
        marker, failures = Path(tmp) / "stopped", Path(tmp) / "failed"
        try:
            env = {**os.environ, STOP_MARKER_ENV: str(marker), FAILURE_NOTE.name: str(failures)}
            proc = subprocess.Popen(command, env=env)
        except OSError as err:
            print(f"rlt launch: cannot run {command[0]}: {err.strerror}", file=sys.stderr)
            return 127  # the shell's "command not found"

        signalled = False  # this pod got a signal (a drain, a preemption), not only its ranks

        def forward(signum: int, _frame: FrameType | None) -> None:
            nonlocal signalled
            signalled = True
            if proc.poll() is None:
                proc.send_signal(signum)

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, forward)
        code = proc.wait()
        if marker.exists():
            lines = marker.read_text().split("\n")
            agreed = any(line.endswith(f" {STOP_AGREED}") for line in lines)
            if agreed or signalled:
                print(f"rlt launch: the ranks stopped after saving ({lines[0]})", file=sys.stderr)
                return ExitCode.STOPPED
            # no signal came to this pod and no gang agreed: the launcher stopped the ranks itself after one of them
            # failed (torchrun's SIGTERM to the rest), a failure the operator must count as one, not a disruption
            print(
                f"rlt launch: a rank stopped on an error after its launcher's signal ({lines[0]}): a rank failed",
                file=sys.stderr,
            )
        cause = first_cause(failures.read_text().splitlines()) if code != 0 and failures.exists() else None
        if cause:  # last in the log: the pod's termination message keeps the log's tail
            print(f"rlt launch: {cause[1]}", file=sys.stderr)
            if code == ExitCode.FAILED and cause[0] in FAIL_FAST:
                return cause[0]  # the launcher's 1 for any failed rank would restart the gang into the same error
    return code if code >= 0 else 128 - code  # killed by a signal: the shell's 128+n


def cmd_launch(args: argparse.Namespace) -> int:
    command = args.launcher[1:] if args.launcher[:1] == ["--"] else args.launcher
    if not command:
        print("rlt launch: give the launcher's command after --", file=sys.stderr)
        return ExitCode.USAGE
    return launch(command)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "launch",
        help="run a trainer launcher (after --), forwarding SIGTERM; exit 75 when its ranks stopped after a save",
    )
    p.add_argument("launcher", nargs=argparse.REMAINDER, help="-- accelerate launch ... | -- torchrun ...")
    p.set_defaults(func=cmd_launch)
