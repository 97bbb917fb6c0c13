"""Pure reconcile logic: (spec, previous status, observed children, now) → new status + actions.

Level-based: every call recomputes the status from the children that exist now. The previous
status contributes only what children cannot show: the restart count, the start/completion
times, stages already finished whose Jobs were cleaned up, and terminal phases (which stick).

decide() and its run-wide steps are here; the gang's steps are in gang_steps, the stage and progress records in
records, the Events in events, the Decision and Plan in decision, the status write in patch (all in this package).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from rlt.checks.validation import validate_spec
from rlt.contract.layout import format_time, parse_time
from rlt.spec.loading import SpecError
from rlt.spec.run import RLTRunSpec
from rlt_operator import builders
from rlt_operator.status import model as status_model
from rlt_operator.status.conditions import no_pods, ready_condition, set_condition, stage_edit_reason, volume_condition
from rlt_operator.status.decision import (
    FAILED,
    PENDING,
    SOON,
    SUCCEEDED,
    SUSPENDED,
    TERMINAL,
    Decision,
    Plan,
    fail,
    min_of,
)
from rlt_operator.status.events import transition_events
from rlt_operator.status.gang_steps import (
    POD_LAG,
    RESTART,
    gang_children,
    gang_outcome,
    launch,
    prune_kept_pods,
    restart_backoff,
    spec_applied,
    trainer_condition,
)
from rlt_operator.status.model import ConditionType, Outputs, Progress, RLTRunStatus
from rlt_operator.status.observed import Observed, job_complete
from rlt_operator.status.patch import previous_status
from rlt_operator.status.records import finished_stage_edits, gang_spec, read_progress, while_held


def decide(
    ref: builders.RunRef,
    generation: int,
    raw_spec: dict[str, Any],
    prev: dict[str, Any] | None,
    observed: Observed,
    now: dt.datetime,
    progress: dict[str, Any] | None = None,
    scrapers: tuple[str, ...] = (),
) -> Decision:
    """One reconcile, as a sequence of named steps (each below, each table-tested in tests/operator/test_status.py).

    `scrapers`: namespaces whose Prometheus may reach the generators' port 8000 (OperatorSettings.scrapers)."""
    prev = dict(prev or {})
    run_status = carried_status(prev, generation)
    plan = Plan(observed)
    spec = valid_spec(ref, raw_spec, run_status, now)
    if spec is None:
        while_held(ref, observed, run_status, progress, now)
        return _finish(ref, prev, run_status, plan, None, now)
    run_wide_children(ref, spec, observed, run_status, plan, now)
    done = finished_stages(ref, spec, observed, run_status, now)
    if run_ended(spec, run_status, done, now):
        return _finish(ref, prev, run_status, plan, _terminal(ref, spec, run_status, plan, observed, now), now)
    stage = current_stage(spec, run_status, done)
    other_active = stop_other_stages(ref, stage, observed, plan)
    if spec.suspend:
        suspend(ref, stage, run_status, plan, now)
        return _finish(ref, prev, run_status, plan, None, now)
    requeue = activate(spec, run_status, now)
    gang = gang_children(ref, spec, stage, run_status, observed, plan, other_active, now)
    outcome = gang_outcome(ref, spec, gang, run_status, observed, plan, now)
    if outcome in (RESTART, POD_LAG):
        return _finish(ref, prev, run_status, plan, SOON, now)
    if outcome == FAILED:
        return _finish(ref, prev, run_status, plan, _terminal(ref, spec, run_status, plan, observed, now), now)
    spec_applied(ref, gang, run_status, now)
    backoff = restart_backoff(gang, run_status, now)
    ready = launch(ref, spec, gang, run_status, plan, scrapers, now)
    trainer_condition(gang, ready, run_status, observed, now, ref.namespace)
    read_progress(progress, stage, run_status, now)
    return _finish(ref, prev, run_status, plan, min_of(min_of(requeue, backoff), SOON if gang.waiting else None), now)


# --------------------------------------------------------------------------- the steps of decide, in order


def carried_status(prev: dict[str, Any], generation: int) -> RLTRunStatus:
    """The previous status with every field decide() relies on filled in; the rest is recomputed from children."""
    run_status = previous_status(prev)
    run_status.phase = run_status.phase or PENDING
    run_status.stage = run_status.stage or ""
    run_status.observed_generation = generation
    run_status.restarts = run_status.restarts or 0
    run_status.disruptions = run_status.disruptions or 0
    run_status.replacements = run_status.replacements or 0
    run_status.completed_stages = list(run_status.completed_stages or [])
    run_status.stage_specs = dict(run_status.stage_specs or {})
    run_status.progress = run_status.progress or Progress()
    run_status.outputs = run_status.outputs or Outputs()  # recomputed below; kept as is while the spec is invalid
    run_status.conditions = run_status.conditions or []
    if not run_status.reason:
        run_status.reason = run_status.message = None
    else:
        run_status.message = run_status.message or ""
    return run_status


def valid_spec(
    ref: builders.RunRef, raw_spec: dict[str, Any], run_status: RLTRunStatus, now: dt.datetime
) -> RLTRunSpec | None:
    """The validated spec, or None with SpecValid False: the run is held (nothing started or stopped: the pods keep
    the last valid spec in their ConfigMap), the condition says why, and fixing the spec resumes from here."""
    conds = run_status.conditions = run_status.conditions or []
    # A run failed as InvalidSpec by an older operator recovers too: invalid specs are not terminal now.
    if run_status.phase == FAILED and run_status.reason == "InvalidSpec":
        run_status.phase = PENDING
        run_status.reason = run_status.message = None
        conds = run_status.conditions = [c for c in conds if c.type != ConditionType.FAILED]
    try:
        spec = validate_spec(raw_spec, name=ref.name, source=f"rltrun/{ref.name}")
    except SpecError as err:  # the same check as `rlt validate`
        message = "; ".join(err.problems)
        if run_status.phase not in TERMINAL:
            run_status.reason, run_status.message = "InvalidSpec", message
        set_condition(conds, ConditionType.SPEC_VALID, False, "InvalidSpec", message, now)
        return None
    set_condition(conds, ConditionType.SPEC_VALID, True, "Valid", "the spec passes rlt validate", now)
    return spec


def run_wide_children(
    ref: builders.RunRef,
    spec: RLTRunSpec,
    observed: Observed,
    run_status: RLTRunStatus,
    plan: Plan,
    now: dt.datetime,
) -> None:
    """The pods' config (kept equal to the spec) and the data claim (its state: VolumeReady)."""
    plan.keep_current("configmaps", builders.configmap(ref, spec), "data")
    claim = observed.persistentvolumeclaims.get(builders.data_claim_name(ref.name, spec))
    if plan.ensure("persistentvolumeclaims", builders.pvc(ref, spec)) and claim is not None:
        volume_condition(run_status, claim, now)  # a user's existingClaim is not watched (it has no run label)


def finished_stages(
    ref: builders.RunRef, spec: RLTRunSpec, observed: Observed, run_status: RLTRunStatus, now: dt.datetime
) -> list[str]:
    """Stages whose Job completed (or completed before and was cleaned up), their outputs and recorded specs."""
    done = [
        s
        for s in spec.stages.enabled()
        if s in (run_status.completed_stages or [])
        or job_complete(observed.jobs.get(builders.trainer_name(ref.name, s)))
    ]
    run_status.completed_stages = done
    run_status.outputs = Outputs.model_validate(builders.outputs(ref.name, spec, done))
    ran = {s: gang_spec(observed.jobs.get(builders.trainer_name(ref.name, s))) for s in done}
    finished_stage_edits(run_status, spec, done, now, ran)
    return done


def run_ended(spec: RLTRunSpec, run_status: RLTRunStatus, done: list[str], now: dt.datetime) -> bool:
    """True when the run is (now) terminal: every stage finished, or the deadline passed, or terminal before."""
    if run_status.phase in TERMINAL:
        return True
    enabled = spec.stages.enabled()
    start = parse_time(run_status.start_time)
    deadline = spec.active_deadline_seconds
    # Completion first: a run whose last Job completed in time but is observed after the deadline
    # (operator down, slow watch) is done, not DeadlineExceeded.
    if len(done) == len(enabled):
        message = "all stages finished: " + ", ".join(enabled)
        run_status.phase, run_status.stage = SUCCEEDED, ""
        run_status.reason, run_status.message = "Succeeded", message
        set_condition(run_status.conditions or [], ConditionType.COMPLETE, True, "Succeeded", message, now)
        return True
    if start and deadline and (now - start).total_seconds() >= deadline and not spec.suspend:
        fail(run_status, "DeadlineExceeded", f"the run was active longer than activeDeadlineSeconds ({deadline}s)", now)
        return True
    return False


def current_stage(spec: RLTRunSpec, run_status: RLTRunStatus, done: list[str]) -> str:
    """The first enabled, unfinished stage (one stage at a time); a new stage starts with fresh progress."""
    stage = next(s for s in spec.stages.enabled() if s not in done)
    if stage != run_status.stage:
        run_status.progress = Progress()
        run_status.trainer_shape = None
    run_status.stage = stage
    return stage


def stop_other_stages(ref: builders.RunRef, stage: str, observed: Observed, plan: Plan) -> list[str]:
    """The running stage was disabled, or an earlier one enabled: a trainer of another stage that is still active
    stops first. Returns the Jobs stopped (the current stage waits for them)."""
    job_name = builders.trainer_name(ref.name, stage)
    other_active = [
        n
        for n, j in observed.jobs.items()
        if n != job_name
        and j.get("active", 0) > 0
        and not j.get("deleting")
        and j["labels"].get(builders.L_STAGE)
        and not job_complete(j)
    ]
    for other in other_active:
        plan.delete("jobs", other, "Foreground")
    return other_active


def suspend(ref: builders.RunRef, stage: str, run_status: RLTRunStatus, plan: Plan, now: dt.datetime) -> None:
    """spec.suspend: every GPU pod goes, the data and config stay; resuming restarts from the last checkpoint."""
    plan.delete("jobs", builders.trainer_name(ref.name, stage), "Foreground")
    plan.delete("statefulsets", builders.generator_name(ref.name), "Foreground")
    run_status.phase, run_status.start_time = SUSPENDED, None
    run_status.reason, run_status.message = "Suspended", "spec.suspend is true"
    conds = run_status.conditions or []
    set_condition(conds, ConditionType.SUSPENDED, True, "Suspended", "all GPU pods deleted; data kept", now)
    no_pods(run_status, "Suspended", f"stage {stage}: suspended (spec.suspend)", now)


def activate(spec: RLTRunSpec, run_status: RLTRunStatus, now: dt.datetime) -> float | None:
    """Resume from Suspended, start the clock; the seconds left until activeDeadlineSeconds (None: no deadline)."""
    if run_status.phase == SUSPENDED:
        conds = run_status.conditions or []
        set_condition(conds, ConditionType.SUSPENDED, False, "Resumed", "resuming from the last checkpoint", now)
        run_status.phase = PENDING
    run_status.reason = run_status.message = None
    if not run_status.start_time:
        run_status.start_time = format_time(now)
    if not spec.active_deadline_seconds:
        return None
    started = parse_time(run_status.start_time)
    assert started is not None
    return max(0.0, spec.active_deadline_seconds - (now - started).total_seconds())


def _terminal(
    ref: builders.RunRef,
    spec: RLTRunSpec,
    run_status: RLTRunStatus,
    plan: Plan,
    observed: Observed,
    now: dt.datetime,
) -> float | None:
    """Free the GPUs now; keep finished trainer Jobs (their logs) until ttlSecondsAfterFinished."""
    if not run_status.completion_time:
        run_status.completion_time = format_time(now)
    if run_status.phase != FAILED:  # a Failed run names the stage that failed (the STAGE column)
        run_status.stage = ""
    # Advice for a gang that no longer runs does not apply: an edit applies to nothing now.
    run_status.conditions = [c for c in run_status.conditions or [] if c.type != ConditionType.SPEC_APPLIED]
    run_status.trainer_shape = run_status.backoff_until = None
    plan.delete("statefulsets", builders.generator_name(ref.name))
    # Every stage's Job, not only the enabled stages': disabling the last unfinished stage while it runs ends the run.
    stage_jobs = [n for n, j in observed.jobs.items() if j["labels"].get(builders.L_STAGE)]
    for name in stage_jobs:
        if observed.jobs[name].get("active", 0) > 0:
            plan.delete("jobs", name, "Foreground")
    no_pods(run_status, "Finished", f"run {str(run_status.phase).lower()}", now)
    ttl = spec.ttl_seconds_after_finished
    if ttl is None:
        return None
    finished = parse_time(run_status.completion_time)
    assert finished is not None
    left = ttl - (now - finished).total_seconds()
    if left > 0:
        return left
    for name in dict.fromkeys([*(builders.trainer_name(ref.name, s) for s in spec.stages.enabled()), *stage_jobs]):
        plan.delete("jobs", name, "Background")
        plan.delete("services", name)  # a trainer's Service has its Job's name
    plan.delete("services", builders.generator_name(ref.name))
    plan.delete("networkpolicies", builders.generator_policy_name(ref.name))
    return None


def _finish(
    ref: builders.RunRef,
    prev: dict[str, Any],
    run_status: RLTRunStatus,
    plan: Plan,
    requeue: float | None,
    now: dt.datetime,
) -> Decision:
    prune_kept_pods(ref, run_status, plan)
    stage_edit_reason(run_status)
    ready_condition(run_status, now)
    # Empty records are left out of the written status (a merge patch then removes them).
    if not run_status.last_failure:
        run_status.last_failure = None
    if not run_status.backoff_until:
        run_status.backoff_until = None
    if not run_status.last_failed_pod:
        run_status.last_failed_pod = None
    if not run_status.stage_specs:
        run_status.stage_specs = None
    status = run_status.model_dump(mode="json", by_alias=True, exclude_none=True)
    status_model.check(status)  # a field the CRD does not list would be pruned by the API server
    kept = plan.obs.child("pods", run_status.last_failed_pod) if run_status.last_failed_pod else None
    failed_container = ((kept or {}).get("ended") or {}).get("container")
    events = transition_events(previous_status(prev), run_status, ref.namespace, failed_container)
    for a in plan.actions:
        if a.verb == "create" and a.plural == "jobs":
            assert a.body is not None, "a create action carries the object it creates"
            lb = a.body["metadata"]["labels"]
            events.append(
                (
                    "Normal",
                    "TrainerCreated",
                    f"stage {lb.get(builders.L_STAGE)}: trainer Job {a.name} created "
                    f"(gang {lb.get(builders.L_RESTART)})",
                )
            )
    return Decision(status=status, actions=plan.actions, events=events, requeue_after=requeue)
