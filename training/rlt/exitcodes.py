"""The exit codes of `rlt` commands: one table for the CLI, the local runner and the operator's pods.

The operator reads a trainer pod's exit code to decide between a gang restart (a crash, a lost node) and failing
the run at once: restarting cannot fix a bad spec, a bad dataset or a stage that finished under another spec.
argparse already exits 2 on a malformed command line, so input problems get their own code, 3.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    FAILURE = 1  # anything unexpected (a crash, a lost process): worth a restart from the last checkpoint
    USAGE = 2  # argparse: the command line itself is malformed
    CONFIG_ERROR = 3  # the spec, the data or the stage state must be fixed by a person: do not restart
