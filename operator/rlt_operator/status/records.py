"""What the status records of stages and progress: the spec each finished stage ran under (StagesCurrent), the
trainer's progress as last read, and a held run's gang still read."""

from __future__ import annotations

import datetime as dt
import functools
import json
from typing import Any

import yaml

from rlt.contract.layout import format_time
from rlt.contract.stage_registry import STAGE_ORDER
from rlt.spec.fingerprint import changed_fields, describe_changes, fingerprint_of, stage_fields
from rlt.spec.loading import SpecError, parse_run
from rlt.spec.run import RLTRunSpec
from rlt_operator import builders
from rlt_operator.status.conditions import set_condition
from rlt_operator.status.decision import TERMINAL
from rlt_operator.status.model import ConditionType, Outputs, Progress, RLTRunStatus, StageSpec
from rlt_operator.status.observed import Observed, job_complete


def while_held(
    ref: builders.RunRef,
    observed: Observed,
    run_status: RLTRunStatus,
    progress: dict[str, Any] | None,
    now: dt.datetime,
) -> None:
    """An invalid spec holds the run (nothing started or stopped), but what its gang does is still read: a stage
    whose Job completes is recorded (with the spec its gang ran), the running stage's progress goes on."""
    if run_status.phase in TERMINAL:
        return
    done = list(run_status.completed_stages or [])
    records = dict(run_status.stage_specs or {})
    for stage in STAGE_ORDER:
        job = observed.jobs.get(builders.trainer_name(ref.name, stage))
        if stage not in done and job is not None and job["labels"].get(builders.L_STAGE) == stage and job_complete(job):
            done.append(stage)
            ran = gang_spec(job)
            if ran is not None:
                records[stage] = stage_record(stage_fields(ran, stage))
                run_status.outputs = Outputs.model_validate(builders.outputs(ref.name, ran, done))
    run_status.completed_stages = [s for s in STAGE_ORDER if s in done]
    run_status.stage_specs = records
    if run_status.stage and run_status.stage in done:
        message = f"stage {run_status.stage} finished; the next stage waits for a valid spec (SpecValid)"
        set_condition(run_status.conditions or [], ConditionType.TRAINER_RUNNING, False, "Held", message, now)
    else:
        read_progress(progress, run_status.stage or "", run_status, now)


def read_progress(progress: dict[str, Any] | None, stage: str, run_status: RLTRunStatus, now: dt.datetime) -> None:
    """The trainer's progress as last read (status/progress.py), when it belongs to the current stage; stepTime moves
    only when the step does (a new stage starts with fresh progress: current_stage)."""
    if progress is None or progress.get("stage", stage) != stage:
        return
    read = Progress.model_validate({k: v for k, v in progress.items() if k != "stage"})
    before = run_status.progress or Progress()
    # A new gang's trainer reports nothing until it has loaded and resumed: the last known values stay till then
    # (STEP and REWARD of `kubectl get rlt` do not go blank at every restart).
    for kept in ("step", "total_steps", "reward_mean", "last_checkpoint"):
        if getattr(read, kept) is None:
            setattr(read, kept, getattr(before, kept))
    if read.step is not None:
        read.step_of_total = f"{read.step}/{read.total_steps}" if read.total_steps else str(read.step)
    same = read.step == before.step and before.step_time
    read.step_time = before.step_time if same else format_time(now)
    run_status.progress = read


def finished_stage_edits(
    run_status: RLTRunStatus,
    spec: RLTRunSpec,
    done: list[str],
    now: dt.datetime,
    ran: dict[str, RLTRunSpec | None] | None = None,
) -> None:
    """Record the spec each stage finished under (status.stageSpecs: the snapshot its last gang ran, `ran`, else the
    current spec) and report a later edit of it.

    A finished stage is never re-run by the operator: an edit of the fields its output depends on is not
    applied, so the condition StagesCurrent says so, naming the changed fields (docs/operator.md)."""
    records = {s: r for s, r in (run_status.stage_specs or {}).items() if s in done}
    edits = []
    for stage in done:
        fields = stage_fields(spec, stage)
        record = records.get(stage)
        if record is None:  # finished now (or before the operator recorded stage specs)
            snapshot = (ran or {}).get(stage)
            record = records[stage] = stage_record(stage_fields(snapshot, stage) if snapshot else fields)
        old = record.values()
        if changed_fields(old, fields):  # not the fingerprints: a field that is not compared (loggingSteps) differs
            edits.append(f"stage {stage} finished under a different spec ({describe_changes(old, fields)})")
    run_status.stage_specs = records
    conds = run_status.conditions = run_status.conditions or []
    if edits:
        set_condition(
            conds,
            ConditionType.STAGES_CURRENT,
            False,
            "FinishedStageEdited",
            "; ".join(edits) + ". Not applied: a finished stage is not run again and its outputs stay "
            "those of the old spec; restore the old values, or train under the new ones in a new RLTRun",
            now,
        )
    elif records:
        set_condition(
            conds,
            ConditionType.STAGES_CURRENT,
            True,
            "Current",
            "finished stages ran under the current spec: " + ", ".join(records),
            now,
        )


def stage_record(fields: dict[str, Any]) -> StageSpec:
    return StageSpec(fingerprint=fingerprint_of(fields), fields=json.dumps(fields, sort_keys=True))


@functools.lru_cache(maxsize=256)
def spec_of(snapshot: str) -> RLTRunSpec | None:
    try:
        return parse_run(yaml.safe_load(snapshot)).spec
    except (SpecError, yaml.YAMLError):
        return None  # written by another version of rlt: not readable here


def gang_spec(job: dict[str, Any] | None) -> RLTRunSpec | None:
    """The spec a trainer Job's gang was created with (its pods' RLT_RUN_YAML), when readable."""
    snapshot = (job or {}).get("snapshot")
    return spec_of(snapshot) if snapshot else None
