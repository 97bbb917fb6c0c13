"""`rlt preflight FILE --stage STAGE --root ROOT [--message-file PATH]`: the trainer pods' init container `validate`.

Before any launcher (whose exit code would be 1 whatever a rank's was) and before any GPU work it checks what only
the pod can see: the spec and the data as `rlt validate` does (rlt.checks.validation), then the run's volume. A
volume retained from an earlier RLTRun of the same name may hold a finished stage under another spec; `rlt stage`
would refuse it inside the launcher and burn every gang restart. Here it exits CONFIG_ERROR, which the Job's
podFailurePolicy fails at once, with a message that says what to do on a cluster.

Between the spec and the volume, the node's NVIDIA driver against the image's CUDA (rlt.checks.driver): one too
old for it exits CONFIG_ERROR with one line naming the driver the image needs (also the termination message).

Last, the capacity plan (`rlt plan`, rlt.checks.capacity) of this pod's stage and of the run's volume: it needs
transformers and DeepSpeed, which the trainer image has and the operator's has not, and takes seconds of CPU, too
slow for a reconcile loop. A misfit exits CONFIG_ERROR with one line that starts with CAPACITY_PREFIX, from which the
operator sets the run's condition CapacityOK=False (reason CapacityExceeded); a plan that fits exits OK with the plan's
headline (CAPACITY_FITS) and a skipped check says so (CAPACITY_NOT_CHECKED). The line is also written to
`--message-file` (the init container's terminationMessagePath), so the operator reads it from the pod's status in
every case (CapacityOK True, Unknown or False), not only from a failed container's log. The GPU's memory is the spec's
(rlt.checks.capacity.spec_gpu_memory); `RLT_CAPACITY_CHECK=false` in spec.env skips the check where the plan is wrong
for the hardware (it is an estimate: a GPU the label does not describe, a model it cannot read).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rlt.checks import driver, validation
from rlt.contract.env import CAPACITY_CHECK
from rlt.contract.exitcodes import CAPACITY_FITS, CAPACITY_NOT_CHECKED, CAPACITY_PREFIX, ExitCode
from rlt.contract.layout import RunLayout
from rlt.contract.stage_registry import STAGE_ORDER
from rlt.spec import fingerprint
from rlt.spec.loading import SpecError


def stale_stage_problem(path: str, stage: str, root: str) -> str | None:
    """One line when stage `stage` (or an earlier one it builds on) finished on this volume under another spec."""
    run = validation.load_valid_run(path)
    layout = RunLayout.for_run(root, run.name)
    try:
        fingerprint.plan_stages(
            layout,
            run.spec,
            [stage],
            has_checkpoint=layout.has_complete_checkpoint,
        )
    except fingerprint.StaleStageError as err:
        return (
            f"stage {err.stage}: the volume already holds it, finished under a different spec ({err.changes}) — "
            f"an earlier RLTRun named {run.name} left it on the retained volume ({layout.stage_dir(err.stage)}). "
            "A finished stage is not redone: restore the old values, or run the new spec under a new name (a new "
            f"volume), or delete the old volume first (kubectl delete rltrun {run.name}; kubectl delete pvc "
            f"{run.name}-data) to start from nothing"
        )
    return None


CAPACITY_CHECK_ENV = CAPACITY_CHECK.name  # "false" (in spec.env) skips the capacity check


def capacity_check(path: str, stage: str) -> tuple[bool, str]:
    """(fits, line) of the capacity plan of `stage` (its pods) and of the run's volume: the misfits naming the field
    to change, else the plan's headline, or why it was not checked. The line starts with CAPACITY_PREFIX."""
    if os.environ.get(CAPACITY_CHECK_ENV, "").strip().lower() in ("false", "0", "no", "off"):
        return True, f"{CAPACITY_PREFIX}{CAPACITY_NOT_CHECKED}{CAPACITY_CHECK_ENV}=false in spec.env"
    from rlt.checks.capacity import plan_for_run, spec_gpu_memory

    run = validation.load_valid_run(path)
    gpu_memory, source = spec_gpu_memory(run.spec)
    # build=False as `rlt validate`: no built-in model is built inside the preflight's 1Gi (peak: 544 MiB, CUDA image)
    plan = plan_for_run(run.spec, gpu_memory, build=False)
    misfits = plan.errors((stage, "all"))
    if not misfits:
        return (
            True,
            f"{CAPACITY_PREFIX}{CAPACITY_FITS}stage {stage}: {plan.headline((stage, 'all'))} (GPUs of {source})",
        )
    return False, (
        f"{CAPACITY_PREFIX}{'; '.join(misfits)} (rlt plan of stage {stage}, GPUs of {source}; "
        f"{CAPACITY_CHECK_ENV}=false in spec.env skips this check)"
    )


def write_message(path: str | None, line: str) -> None:
    """The capacity line as the container's termination message (terminationMessagePath): the operator reads it
    from the pod's status whether the check passed or not, with no log to read."""
    if not path:
        return
    try:
        with Path(path).open("w", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError as err:  # the condition is a report: an unwritable file must not fail the pod
        print(f"preflight: cannot write the termination message {path}: {err.strerror}", file=sys.stderr)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`rlt preflight`."""
    p = sub.add_parser(
        "preflight",
        help="the trainer pod's init check: `rlt validate`, then the run's volume and the stage's capacity plan",
    )
    p.add_argument("file", metavar="FILE", help="the run file, or env:VAR (the pod's RLT_RUN_YAML)")
    p.add_argument("--stage", choices=STAGE_ORDER, help="the stage this pod runs: check the volume for it")
    p.add_argument("--root", metavar="ROOT", help="the run volume's mount (with --stage; default: the current folder)")
    p.add_argument(
        "--message-file", metavar="FILE", help="write the capacity check's line here (the termination message)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    status = validation.main([args.file])
    if status != ExitCode.OK or not args.stage:
        return status
    # The node's driver first: with one too old for the image's CUDA no stage can start (rlt.checks.driver).
    if too_old := driver.check():
        write_message(args.message_file, too_old)
        print(too_old, file=sys.stderr)
        return ExitCode.CONFIG_ERROR
    try:
        problem = stale_stage_problem(args.file, args.stage, args.root or ".")
        fits, line = (False, "") if problem else capacity_check(args.file, args.stage)
    except SpecError as err:  # checked above; kept for a file changed in between
        print(str(err), file=sys.stderr)
        return ExitCode.CONFIG_ERROR
    if problem:
        print(problem, file=sys.stderr)
        return ExitCode.CONFIG_ERROR
    write_message(args.message_file, line)
    print(line, file=sys.stdout if fits else sys.stderr)
    return ExitCode.OK if fits else ExitCode.CONFIG_ERROR
