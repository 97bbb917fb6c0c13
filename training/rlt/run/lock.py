"""One local command at a time per run folder: two `rlt run` (or `rlt compare`) of the same file would write the
same stage folders, checkpoints and metrics.jsonl.

The lock is an OS advisory lock (fcntl.flock) on OUTPUT/<run>/.rlt.lock, held for the life of the process: the
kernel releases it when the process ends, however it ends, so a crashed run never leaves a stale lock behind. The
file holds the holder's pid and command, for the refusal to name.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

LOCK_FILE = ".rlt.lock"

_held: dict[Path, IO[str]] = {}  # open lock files of this process (closing one would release its lock)


class RunLock:
    """A held lock; `release()` gives it back before the process ends (callers that go on, such as tests)."""

    def __init__(self, path: Path, owned: bool):
        self.path, self.owned = path, owned

    def release(self) -> None:
        f = _held.pop(self.path.resolve(), None) if self.owned else None
        if f is not None:
            f.close()  # closing the file drops the flock


class RunLockedError(RuntimeError):
    """Another process holds the run folder; the message is one line naming its pid."""


def lock_run_folder(root: str | Path, command: str) -> RunLock:
    """Take the lock on `root` (created if needed) for this process, or raise RunLockedError naming the holder."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_FILE
    if path.resolve() in _held:
        return RunLock(path, owned=False)  # this process already holds it: the outer holder releases it
    f = Path(path).open("a+")  # noqa: SIM115 - kept open: the lock lives as long as the file stays open
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise RunLockedError(
            f"{root} is in use by {holder}; wait for it to finish (or stop it), or use another --output-dir"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"{command} (pid {os.getpid()})\n")
    f.flush()
    _held[path.resolve()] = f
    return RunLock(path, owned=True)
