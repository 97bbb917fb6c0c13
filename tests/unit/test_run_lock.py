"""Two `rlt run` of the same file at once: the second is refused in one line naming the first's pid, before it
writes anything."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from suite_helpers import TINY

from rlt.contract.exitcodes import ExitCode
from rlt.run.lock import LOCK_FILE


def test_a_second_run_of_the_same_file_is_refused_naming_the_first(tmp_path):
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "rlt.cli", "run", str(TINY), "--output-dir", str(out), "--no-progress"]
    first = subprocess.Popen(
        [*cmd, "--metrics-port", "-1", "--device", "cpu"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        lock = out / "tiny" / LOCK_FILE
        deadline = time.monotonic() + 120
        while not (lock.exists() and "pid" in lock.read_text()) and time.monotonic() < deadline:
            assert first.poll() is None, "the first run ended before taking its lock"
            time.sleep(0.2)
        assert f"pid {first.pid}" in lock.read_text()
        # Frozen while the second starts: on a busy machine the tiny run could finish, and let go, before the second
        # has even imported torch. A stopped process keeps its flock, as a slow live one does.
        os.killpg(first.pid, signal.SIGSTOP)
        metrics_before = sorted(p.name for p in (out / "tiny").iterdir())
        second = subprocess.run([*cmd, "--metrics-port", "-1"], capture_output=True, text=True, timeout=120)
        assert first.poll() is None, "the first run must still hold the folder for this test to mean anything"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert second.returncode == ExitCode.CONFIG_ERROR, second.stderr
    assert "Traceback" not in second.stderr
    line = second.stderr.strip().splitlines()[-1]
    assert line == (
        f"rlt run: {out / 'tiny'} is in use by rlt run (pid {first.pid}); wait for it to finish (or stop it), "
        "or use another --output-dir"
    ), second.stderr
    assert "starting" not in second.stdout
    assert metrics_before  # the first run's files were there and the second added none of its own
