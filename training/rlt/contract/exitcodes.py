"""Exit codes of `rlt` commands that the cluster acts on: one table for the CLI, the local runner and the operator's
trainer Job (its podFailurePolicy matches them).

A config or data error fails the same way on every retry, so the trainer Job fails at once instead of burning gang
restarts; anything else (exit 1, a signal) may be transient and is restarted from the last checkpoint. A trainer
asked to stop (SIGTERM) that saved first exits STOPPED: a disruption. These use the BSD sysexits values, so they
collide neither with Python's 1, argparse's 2 nor a signal's 128+n.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # anything unexpected (a crash, a lost process): retried (gang restart, counted against backoffLimit)
    USAGE = 2  # argparse: the command line itself is malformed
    DATA_ERROR = 65  # EX_DATAERR: the dataset is unusable (missing file, unmapped column, bad rows)
    # EX_TEMPFAIL: asked to stop (SIGTERM: preemption, drain, suspend), the gang saved a complete checkpoint and
    # exited; a disruption, not a failure (podFailurePolicy Ignore; the operator restarts the gang uncounted)
    STOPPED = 75
    # EX_NOPERM: `rlt validate --server` may not make its check (the user may create RLTRuns but not the children
    # it dry-runs): one line naming the verbs and kinds; a verdict on the user's rights, not on the run
    NO_PERMISSION = 77
    # EX_UNAVAILABLE: `rlt validate --server` found no API server to ask (no kubeconfig, or it did not answer): the
    # check was not made, no verdict on the run either way; or `--device cuda` where no CUDA device is visible
    UNAVAILABLE = 69
    CONFIG_ERROR = 78  # EX_CONFIG: the spec is invalid, or a stage finished under another spec, or a port is taken


# Exit codes that mean "retrying cannot help": the Job fails at once (podFailurePolicy FailJob).
FAIL_FAST = (ExitCode.DATA_ERROR, ExitCode.CONFIG_ERROR)
# Exit codes that mean "stopped on purpose, nothing lost": a disruption (podFailurePolicy Ignore, not counted).
DISRUPTION = (ExitCode.STOPPED,)
# The start of the preflight's CONFIG_ERROR line for a capacity plan that does not fit (rlt.checks.preflight); the
# operator sets condition CapacityOK=False from it, distinct from other config errors.
CAPACITY_PREFIX = "capacity: "
# What follows CAPACITY_PREFIX when the preflight exits OK: the plan fits (its headline follows), or the check was
# skipped (RLT_CAPACITY_CHECK=false). The preflight writes the line to its termination message (TERMINATION_LOG), from
# which the operator sets CapacityOK=True (Fits) or Unknown (NotChecked).
CAPACITY_FITS = "fits: "
CAPACITY_NOT_CHECKED = "not checked: "
# The preflight's termination message file: the builders set it as the init container's terminationMessagePath.
TERMINATION_LOG = "/dev/termination-log"
