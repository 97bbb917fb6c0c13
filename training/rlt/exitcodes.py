"""Exit codes of `rlt` commands that the cluster acts on (one place: the CLI exits with them, the operator's
Job podFailurePolicy matches them).

A config or data error fails the same way on every retry, so the trainer Job fails at once instead of
burning gang restarts; anything else (exit 1, a signal) may be transient and is restarted. The values
are the BSD sysexits ones, so they do not collide with Python's 1 or a signal's 128+n.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # anything else: retried (gang restart, counted against backoffLimit)
    DATA_ERROR = 65  # EX_DATAERR: the dataset is unusable (missing file, unmapped column, bad rows)
    CONFIG_ERROR = 78  # EX_CONFIG: the RLTRun fails validation (rlt.validation)


# Exit codes that mean "retrying cannot help": the Job fails at once (podFailurePolicy FailJob).
FAIL_FAST = (ExitCode.DATA_ERROR, ExitCode.CONFIG_ERROR)
