"""Pure reconcile logic: (spec, previous status, observed children, now) → new status + actions.

Level-based: every call recomputes the status from the children that exist now. The previous
status contributes only what children cannot show: the restart count, the start/completion
times, stages already finished whose Jobs were cleaned up, and terminal phases (which stick).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from dataclasses import dataclass
from typing import Any

import yaml

from rlt.checks.validation import validate_spec
from rlt.contract.api import TERMINAL_PHASES, Phase
from rlt.contract.layout import format_time, parse_time
from rlt.contract.stage_registry import STAGE_ORDER
from rlt.spec.fingerprint import describe_changes, fingerprint_of, flat_spec, stage_fields
from rlt.spec.loading import SpecError, parse_run
from rlt.spec.run import RLTRunSpec, needs_generators
from rlt_operator import builders, status_model
from rlt_operator.conditions import (
    has_condition,
    kubectl,
    no_pods,
    pod_conditions,
    ready_condition,
    set_condition,
    stage_edit_reason,
    stuck_terminating,
    volume_condition,
)
from rlt_operator.gang import (
    capacity_condition,
    current_gang,
    failed_trainer_pod,
    gang_failure,
    kept_pod_patch,
    placement_timeout,
    trainer_shape,
)
from rlt_operator.observed import (
    Observed,
    job_complete,
)
from rlt_operator.status_model import ConditionType, Outputs, Progress, RLTRunStatus, StageSpec

PENDING, RUNNING, SUSPENDED, SUCCEEDED, FAILED = (
    Phase.PENDING,
    Phase.RUNNING,
    Phase.SUSPENDED,
    Phase.SUCCEEDED,
    Phase.FAILED,
)
TERMINAL = TERMINAL_PHASES

# Conditions whose turning False (or changing while False) is a Warning Event.
WARN_WHEN_FALSE = (
    ConditionType.PODS_SCHEDULABLE,
    ConditionType.PODS_HEALTHY,
    ConditionType.VOLUME_READY,
    ConditionType.STAGES_CURRENT,
)

# Seconds to re-check while something is expected to change soon (deletions finishing, restarts).
SOON = 2.0
# After the n-th counted gang failure the next gang waits BACKOFF_BASE * 2**(n-1) s, at most BACKOFF_CAP (the Job
# controller's pod back-off, shorter: a gang restart already costs a model load); a disruption restarts at once.
BACKOFF_BASE, BACKOFF_CAP = 10.0, 300.0


def restart_delay(counted_failures: int) -> float:
    """Seconds the next gang waits after the `counted_failures`-th failure (0: none yet)."""
    if counted_failures <= 0:
        return 0.0
    return min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** min(counted_failures - 1, 30))


# --------------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Action:
    verb: str  # create | patch | delete
    plural: str
    name: str
    body: dict[str, Any] | None = None
    propagation: str = "Background"


@dataclass
class Decision:
    status: dict[str, Any]
    actions: list[Action]
    events: list[tuple[str, str, str]]  # (Normal|Warning, reason, message)
    requeue_after: float | None = None


def _min(a: float | None, b_: float | None) -> float | None:
    vals = [v for v in (a, b_) if v is not None]
    return min(vals) if vals else None


class _Plan:
    """Accumulates actions against what is observed, so nothing is created or deleted twice."""

    def __init__(self, observed: Observed):
        self.obs = observed
        self.actions: list[Action] = []

    def ensure(self, plural: str, manifest: dict[str, Any] | None) -> bool:
        """Create if absent; True when it exists already."""
        if manifest is None:
            return True
        name = manifest["metadata"]["name"]
        if name in getattr(self.obs, plural):
            return True
        self.actions.append(Action("create", plural, name, manifest))
        return False

    def delete(self, plural: str, name: str, propagation: str = "Background") -> None:
        child = self.obs.child(plural, name)
        queued = any(a.verb == "delete" and a.name == name and a.plural == plural for a in self.actions)
        if child is not None and not child.get("deleting") and not queued:
            self.actions.append(Action("delete", plural, name, propagation=propagation))


def previous_status(prev: dict[str, Any]) -> RLTRunStatus:
    """The typed status of what the server (or our last write) holds: fields the model does not know, and condition
    types no longer in use (an older operator's), are dropped rather than failing every reconcile."""
    known = {k: v for k, v in prev.items() if k in OWN_STATUS_FIELDS}
    conds = known.get("conditions") or []
    known["conditions"] = [dict(c) for c in conds if c.get("type") in set(ConditionType)]
    return RLTRunStatus.model_validate(known)


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
    plan = _Plan(observed)
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
    if outcome == RESTART:
        return _finish(ref, prev, run_status, plan, SOON, now)
    if outcome == FAILED:
        return _finish(ref, prev, run_status, plan, _terminal(ref, spec, run_status, plan, observed, now), now)
    spec_applied(ref, gang, run_status, now)
    backoff = restart_backoff(gang, run_status, now)
    ready = launch(ref, spec, gang, run_status, plan, scrapers, now)
    trainer_condition(gang, ready, run_status, observed, now, ref.namespace)
    read_progress(progress, stage, run_status, now)
    return _finish(ref, prev, run_status, plan, _min(_min(requeue, backoff), SOON if gang.waiting else None), now)


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
    plan: _Plan,
    now: dt.datetime,
) -> None:
    """The pods' config (kept equal to the spec) and the data claim (its state: VolumeReady)."""
    cm = builders.configmap(ref, spec)
    if plan.ensure("configmaps", cm):
        have = observed.configmaps[cm["metadata"]["name"]].get("configHash")
        if have != cm["metadata"]["annotations"][builders.A_CONFIG_HASH]:
            plan.actions.append(
                Action(
                    "patch",
                    "configmaps",
                    cm["metadata"]["name"],
                    {"metadata": {"annotations": cm["metadata"]["annotations"]}, "data": cm["data"]},
                )
            )
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
        _fail(
            run_status, "DeadlineExceeded", f"the run was active longer than activeDeadlineSeconds ({deadline}s)", now
        )
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


def stop_other_stages(ref: builders.RunRef, stage: str, observed: Observed, plan: _Plan) -> list[str]:
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


def suspend(ref: builders.RunRef, stage: str, run_status: RLTRunStatus, plan: _Plan, now: dt.datetime) -> None:
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


@dataclass
class Gang:
    """The current stage's gang as gang_children leaves it: its surviving children and what it runs with."""

    stage: str
    restarts: int
    job_name: str
    gen_name: str
    run_spec: RLTRunSpec  # the spec with the trainer shape the gang runs
    gens_needed: bool
    sts: dict[str, Any] | None  # None: absent or being replaced
    job: dict[str, Any] | None
    waiting: bool  # stale children are still going: create nothing new yet
    backoff: float = 0.0  # seconds left before a new gang may be created (restart_backoff)


def gang_children(
    ref: builders.RunRef,
    spec: RLTRunSpec,
    stage: str,
    run_status: RLTRunStatus,
    observed: Observed,
    plan: _Plan,
    other_active: list[str],
    now: dt.datetime,
) -> Gang:
    """Children of another stage or of an older gang are stale: delete them and wait until gone."""
    restarts = run_status.restarts or 0
    job_name, gen_name = builders.trainer_name(ref.name, stage), builders.generator_name(ref.name)
    gens_needed = needs_generators(spec, stage)
    waiting = bool(other_active) or any(
        j.get("deleting") and j.get("active", 0) > 0 and n != job_name for n, j in observed.jobs.items()
    )
    # The trainer's shape (nodes x gpus) is frozen for a stage once it has a checkpoint: ZeRO checkpoints
    # resume only with the world size that wrote them. Before that, a new shape replaces the gang at once.
    shape = trainer_shape(spec, stage, run_status, now)
    run_spec = builders.with_trainer_shape(spec, shape.nodes, shape.gpus)
    sts = observed.statefulsets.get(gen_name)
    if sts is not None and (
        sts.get("deleting")
        or not gens_needed
        or sts["labels"].get(builders.L_STAGE) != stage
        or sts["labels"].get(builders.L_RESTART) != str(restarts)
        or _foreign(sts, ref)
    ):
        plan.delete("statefulsets", gen_name, "Foreground")
        sts, waiting = None, True
    job = observed.jobs.get(job_name)
    if job is not None and (
        job.get("deleting")
        or job["labels"].get(builders.L_RESTART) != str(restarts)
        or job["labels"].get(builders.L_SHAPE, builders.shape_label(run_spec, stage))
        != builders.shape_label(run_spec, stage)
        or _foreign(job, ref)
    ):
        plan.delete("jobs", job_name, "Foreground")
        job, waiting = None, True
    # Running once a pod of the run has run; Pending before, with what it waits for (a quota, an image, a scheduler:
    # the reason), however long its Job or StatefulSet has existed.
    if run_status.completed_stages or run_status.phase == RUNNING or gang_ran(observed, stage, restarts, job, sts):
        run_status.phase = RUNNING
    return Gang(stage, restarts, job_name, gen_name, run_spec, gens_needed, sts, job, waiting)


def gang_ran(
    observed: Observed, stage: str, restarts: int, job: dict[str, Any] | None, sts: dict[str, Any] | None
) -> bool:
    """Whether a pod of the current gang has run: a container started (the pod Running or Succeeded, or ended with an
    exit code), or its controller counts a ready or finished pod (Job status.ready/succeeded, readyReplicas)."""
    pods = current_gang(observed.pods, stage, restarts)
    if any(p.get("phase") in ("Running", "Succeeded") or p.get("exitCode") is not None for p in pods):
        return True
    return bool((job or {}).get("ready") or (job or {}).get("succeeded") or (sts or {}).get("readyReplicas"))


RESTART = "Restart"  # gang_outcome: the gang is being restarted


def keep_failed_pod(
    ref: builders.RunRef, gang: Gang, run_status: RLTRunStatus, observed: Observed, plan: _Plan
) -> None:
    """The failed gang's failed trainer pod outlives its Job (deleted now for a restart, or later by a TTL), so its
    log stays readable: it is handed to the run (gang.kept_pod_patch) before anything is deleted, and named in
    status.lastFailedPod. One per run: the one kept before is deleted (prune_kept_pods)."""
    name = failed_trainer_pod(observed.pods, gang.stage, gang.restarts)
    pod = observed.child("pods", name) if name else None
    if name is None or pod is None or pod.get("deleting"):
        return
    if pod.get("owner") != ref.uid:
        plan.actions.append(Action("patch", "pods", name, kept_pod_patch(ref, pod.get("finalizers") or [])))
    run_status.last_failed_pod = name


def prune_kept_pods(ref: builders.RunRef, run_status: RLTRunStatus, plan: _Plan) -> None:
    """Pods the run itself owns are failed pods kept for their logs: all but status.lastFailedPod go; a kept pod
    someone deleted is no longer named."""
    if run_status.last_failed_pod and plan.obs.child("pods", run_status.last_failed_pod) is None:
        run_status.last_failed_pod = None
    for pod in plan.obs.pods:
        if pod.get("owner") == ref.uid and pod["name"] != run_status.last_failed_pod:
            plan.delete("pods", pod["name"])


def gang_outcome(
    ref: builders.RunRef,
    spec: RLTRunSpec,
    gang: Gang,
    run_status: RLTRunStatus,
    observed: Observed,
    plan: _Plan,
    now: dt.datetime,
) -> str | None:
    """A failure anywhere in the current gang restarts the whole gang (trainer and generators), except a
    config/data error of any of its pods (retrying cannot help: fail now); a disruption restarts it uncounted, and
    a ReadWriteOnce re-placement counts against spec.replacementLimit instead of spec.backoffLimit.
    Returns RESTART, FAILED, or None (the gang goes on)."""
    stage, restarts = gang.stage, gang.restarts
    live = gang.sts is not None
    failure, fatal, disrupted = gang_failure(gang.job, gang.job_name, observed.pods, stage, restarts, live)
    capacity_condition(run_status, observed.pods, stage, restarts, now)
    if fatal or failure:
        keep_failed_pod(ref, gang, run_status, observed, plan)
    if fatal:
        _fail(
            run_status,
            "ConfigError",
            f"{fatal}; not retried (fix what it names: the spec, the data or the node; then create the run again)",
            now,
        )
        return FAILED
    replaced = False
    if not failure and spec.storage.access_mode == "ReadWriteOnce" and gang.gens_needed:
        failure = placement_timeout(observed.pods, stage, restarts, now)
        replaced = disrupted = failure is not None
    if not failure:
        return None
    replacements = run_status.replacements or 0
    if replaced and replacements >= spec.replacement_limit:
        message = (
            f"{failure}; re-placements exhausted (replacementLimit {spec.replacement_limit}): give the run a node "
            "with room for its trainer and generators together, or a ReadWriteMany volume"
        )
        _fail(run_status, "ReplacementLimitExceeded", message, now)
        return FAILED
    counted = restarts - (run_status.disruptions or 0) - replacements
    if not (disrupted or counted < spec.backoff_limit):
        message = f"{failure}; gang restarts exhausted (backoffLimit {spec.backoff_limit})"
        _fail(run_status, "BackoffLimitExceeded", message, now)
        return FAILED
    run_status.restarts = restarts + 1
    if replaced:
        run_status.replacements = replacements + 1
    elif disrupted:
        run_status.disruptions = (run_status.disruptions or 0) + 1
    delay = 0.0 if disrupted else restart_delay(counted + 1)
    run_status.backoff_until = format_time(now + dt.timedelta(seconds=delay)) if delay else None
    plan.delete("jobs", gang.job_name, "Foreground")
    plan.delete("statefulsets", gang.gen_name, "Foreground")
    set_condition(run_status.conditions or [], ConditionType.TRAINER_RUNNING, False, "GangRestart", failure, now)
    run_status.last_failure = failure
    return RESTART


def restart_backoff(gang: Gang, run_status: RLTRunStatus, now: dt.datetime) -> float | None:
    """Seconds the next gang still waits after a failed one (status.backoffUntil), or None once it may start.
    Children of the gang that exist already (an operator restarted mid-wait found them) are left alone."""
    until = parse_time(run_status.backoff_until)
    left = (until - now).total_seconds() if until else 0.0
    if left <= 0:
        run_status.backoff_until = None
        return None
    gang.backoff = left
    return left


# Spec fields the operator applies at once (or reads only at creation/deletion): never pending for a gang.
APPLIED_AT_ONCE = (
    "suspend",
    "backoffLimit",
    "replacementLimit",
    "activeDeadlineSeconds",
    "ttlSecondsAfterFinished",
)


def pending_edits(ref: builders.RunRef, gang: Gang) -> str | None:
    """The edits the running gang does not run yet (its snapshot against what a gang created now would get), named
    (`stages.rl.learningRate 1e-05 -> 5e-05`); None when it runs the current spec."""
    ran = gang.job.get("snapshot") if gang.job else None
    if not ran:
        return None
    now_text = builders.pod_config(ref, gang.run_spec)
    if now_text == ran:
        return None
    old, new = _spec_of(ran), _spec_of(now_text)
    if old is None or new is None:
        return "the spec"

    def gang_fields(spec: RLTRunSpec) -> dict[str, Any]:
        return {
            k: v
            for k, v in flat_spec(spec).items()
            if k not in APPLIED_AT_ONCE and not k.startswith("storage.") and not k.endswith(".enabled")
        }

    before, after = gang_fields(old), gang_fields(new)
    return describe_changes(before, after) if before != after else None


def spec_applied(ref: builders.RunRef, gang: Gang, run_status: RLTRunStatus, now: dt.datetime) -> None:
    """SpecApplied: False (PendingGangRestart) while the running gang runs an older spec than the run's (an accepted
    edit reaches the pods at the next gang restart or stage); ShapeFrozen (trainer_shape) wins."""
    conds = run_status.conditions = run_status.conditions or []
    if any(c.type == ConditionType.SPEC_APPLIED and c.reason == "ShapeFrozen" for c in conds):
        return
    pending = pending_edits(ref, gang)
    if pending:
        message = (
            f"stage {gang.stage}: the running gang ({gang.restarts}) keeps the spec it was created with; "
            f"{pending} apply from the next gang restart or stage (suspend and resume to apply now)"
        )
        set_condition(conds, ConditionType.SPEC_APPLIED, False, "PendingGangRestart", message, now)
    elif has_condition(run_status, ConditionType.SPEC_APPLIED):
        set_condition(conds, ConditionType.SPEC_APPLIED, True, "Applied", "the running gang runs the current spec", now)


def launch(
    ref: builders.RunRef,
    spec: RLTRunSpec,
    gang: Gang,
    run_status: RLTRunStatus,
    plan: _Plan,
    scrapers: tuple[str, ...],
    now: dt.datetime,
) -> bool:
    """Generators first; the trainer joins them only once every server answers /health. True when they are ready
    (or not needed)."""
    stage, restarts = gang.stage, gang.restarts
    ready = True
    if gang.gens_needed:
        plan.ensure("networkpolicies", builders.generator_network_policy(ref, spec, scrapers))
        plan.ensure("services", builders.generator_service(ref, spec, stage, restarts))
        if gang.sts is None and not gang.waiting and not gang.backoff:
            plan.ensure("statefulsets", builders.generator_statefulset(ref, spec, stage, restarts))
        want = spec.resources.generator.replicas
        have = gang.sts["readyReplicas"] if gang.sts else 0
        ready = gang.sts is not None and have >= want
        set_condition(
            run_status.conditions or [],
            ConditionType.GENERATORS_READY,
            ready,
            "Ready" if ready else "Starting",
            f"{have}/{want} vLLM servers ready",
            now,
        )
    if ready and not gang.waiting and not gang.backoff:
        plan.ensure("services", builders.trainer_service(ref, gang.run_spec, stage, restarts))
        if gang.job is None:
            plan.ensure("jobs", builders.trainer_job(ref, gang.run_spec, stage, restarts))
    return ready


def trainer_condition(
    gang: Gang, ready: bool, run_status: RLTRunStatus, observed: Observed, now: dt.datetime, namespace: str = ""
) -> None:
    """TrainerRunning, and the pod conditions of the current gang. Job.status.active counts Pending pods too: the
    trainer runs once every one of its pods does."""
    job = gang.job
    pods = current_gang(observed.pods, gang.stage, gang.restarts)
    want_pods = int(job.get("completions", 1)) if job else 0
    running_pods = sum(
        1 for p in pods if p["labels"].get(builders.L_ROLE) == builders.ROLE_TRAINER and p.get("phase") == "Running"
    )
    active = bool(job and job.get("active", 0) > 0) and running_pods >= want_pods
    why = (
        "trainer running"
        if active
        else f"gang {gang.restarts} waits {gang.backoff:.0f}s before it starts (back-off after a failed gang)"
        if gang.backoff and job is None
        else "trainer Job suspended (Kueue: waiting to be admitted again)"
        if job and job.get("suspended")
        else "waiting for generators"
        if not ready
        else f"{running_pods}/{want_pods} trainer pods running"
        if job
        else "trainer starting"
    )
    set_condition(
        run_status.conditions or [],
        ConditionType.TRAINER_RUNNING,
        active,
        "Running" if active else waiting_reason(why),
        f"stage {gang.stage}: {why}",
        now,
    )
    # A restart waiting on an old gang's pod that never goes (its node is NotReady) says so (docs/operator.md).
    blocked = stuck_terminating(observed.pods, now, namespace) if gang.waiting else None
    pod_conditions(run_status, pods, now, blocked, namespace)


def waiting_reason(why: str) -> str:
    """TrainerRunning's reason while the trainer does not run: what the run waits for (the Trainer column of
    `kubectl get rlt`: a Running run is either training or waiting for something)."""
    if "back-off" in why:
        return "RestartBackOff"
    if "Kueue" in why:
        return "WaitingForAdmission"
    if "generators" in why:
        return "WaitingForGenerators"
    return "WaitingForPods"


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
    """The trainer's progress as last read (progress.py), when it belongs to the current stage; stepTime moves
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
        if record.fingerprint != fingerprint_of(fields):
            old = record.values()
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
def _spec_of(snapshot: str) -> RLTRunSpec | None:
    try:
        return parse_run(yaml.safe_load(snapshot)).spec
    except (SpecError, yaml.YAMLError):
        return None  # written by another version of rlt: not readable here


def gang_spec(job: dict[str, Any] | None) -> RLTRunSpec | None:
    """The spec a trainer Job's gang was created with (its pods' RLT_RUN_YAML), when readable."""
    snapshot = (job or {}).get("snapshot")
    return _spec_of(snapshot) if snapshot else None


def _foreign(child: dict[str, Any], ref: builders.RunRef) -> bool:
    """A GPU child of an earlier RLTRun with the same name (deleted and re-created): never adopt it."""
    return child.get("owner") not in (None, ref.uid)


def _fail(run_status: RLTRunStatus, reason: str, message: str, now: dt.datetime) -> None:
    run_status.phase, run_status.reason, run_status.message = FAILED, reason, message
    run_status.conditions = run_status.conditions or []
    set_condition(run_status.conditions, ConditionType.FAILED, True, reason, message, now)


def _terminal(
    ref: builders.RunRef,
    spec: RLTRunSpec,
    run_status: RLTRunStatus,
    plan: _Plan,
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
    for stage in spec.stages.enabled():
        job = observed.jobs.get(builders.trainer_name(ref.name, stage))
        if job and job.get("active", 0) > 0:
            plan.delete("jobs", builders.trainer_name(ref.name, stage), "Foreground")
    no_pods(run_status, "Finished", f"run {str(run_status.phase).lower()}", now)
    ttl = spec.ttl_seconds_after_finished
    if ttl is None:
        return None
    finished = parse_time(run_status.completion_time)
    assert finished is not None
    left = ttl - (now - finished).total_seconds()
    if left > 0:
        return left
    for stage in spec.stages.enabled():
        plan.delete("jobs", builders.trainer_name(ref.name, stage), "Background")
        plan.delete("services", builders.trainer_name(ref.name, stage))
    plan.delete("services", builders.generator_name(ref.name))
    plan.delete("networkpolicies", builders.generator_policy_name(ref.name))
    return None


def transition_events(prev: RLTRunStatus, new: RLTRunStatus, namespace: str = "") -> list[tuple[str, str, str]]:
    """Kubernetes Events for what changed between two statuses (kubectl hints in `namespace`)."""
    ev: list[tuple[str, str, str]] = []
    # A failed pod kept now (keep_failed_pod): where its log is, in the GangRestart or Failed Event.
    kept = new.last_failed_pod if new.last_failed_pod != prev.last_failed_pod else None
    logs = f"; its log: {kubectl(namespace)} logs {kept}" if kept else ""
    resume = resume_point(new)
    if (new.restarts or 0) > (prev.restarts or 0):
        uncounted = (new.disruptions or 0) > (prev.disruptions or 0)
        replaced = (new.replacements or 0) > (prev.replacements or 0)
        ev.append(
            (
                "Warning",
                "GangRestart",
                f"restart {new.restarts}: {new.last_failure or 'a pod failed'}{logs}; "
                f"trainer and generators restart from {resume}"
                + (" (a disruption: not counted against backoffLimit)" if uncounted else "")
                + (f" (re-placement {new.replacements}: counted against replacementLimit)" if replaced else "")
                + (f", not before {new.backoff_until} (back-off)" if new.backoff_until else ""),
            )
        )
        logs = ""
    if new.reason == "InvalidSpec" and (prev.reason, prev.message) != ("InvalidSpec", new.message):
        ev.append(("Warning", "InvalidSpec", f"{new.message}; nothing is started or stopped until the spec is fixed"))
    elif prev.reason == "InvalidSpec" and new.reason != "InvalidSpec":
        ev.append(("Normal", "SpecValid", "the spec is valid again; reconciling"))
    before = {c.type: c for c in prev.conditions or []}
    for c in new.conditions or []:
        if c.type in WARN_WHEN_FALSE and c.status == "False":
            old = before.get(c.type)
            if old is None or (old.status, old.reason, old.message) != ("False", c.reason, c.message):
                ev.append(("Warning", c.reason or c.type, c.message or ""))
    for stage in new.completed_stages or []:
        if stage not in (prev.completed_stages or []):
            ev.append(("Normal", "StageCompleted", f"stage {stage} completed"))
    if new.stage and new.stage != (prev.stage or ""):
        ev.append(("Normal", "StageStarted", f"stage {new.stage} started"))
    if new.phase != prev.phase:
        if new.phase == FAILED:
            ev.append(("Warning", new.reason or "Failed", (new.message or "run failed") + logs))
        elif new.phase == SUCCEEDED:
            ev.append(("Normal", "Succeeded", new.message or "run succeeded"))
        elif new.phase == SUSPENDED:
            ev.append(("Normal", "Suspended", "GPU pods deleted; data kept"))
        elif prev.phase == SUSPENDED:
            ev.append(("Normal", "Resumed", f"resuming from {resume}"))
        elif new.phase == RUNNING:
            ev.append(("Normal", "Running", f"stage {new.stage}: the run's pods run"))
    ev += waiting_events(prev, new)
    return ev


def resume_point(run_status: RLTRunStatus) -> str:
    """Where a new gang of the stage resumes: the newest checkpoint the trainer reported (status.progress)."""
    checkpoint = (run_status.progress or Progress()).last_checkpoint
    return f"checkpoint {checkpoint}" if checkpoint else "the stage's last checkpoint, if it has one"


def waiting_events(prev: RLTRunStatus, new: RLTRunStatus) -> list[tuple[str, str, str]]:
    """A Pending run (no pod of it has run yet) says what it waits for (TrainerRunning's reason), once per reason; a
    problem that holds it (the run's reason: an image, a quota, a name conflict) has its own Warning."""

    def waits_for(st: RLTRunStatus) -> tuple[str, str] | None:
        trainer = next((c for c in st.conditions or [] if c.type == ConditionType.TRAINER_RUNNING), None)
        if st.phase != PENDING or trainer is None or trainer.status != "False":
            return None
        return trainer.reason or "Waiting", trainer.message or ""

    now, before = waits_for(new), waits_for(prev)
    if now is None or prev.phase == SUSPENDED or (before is not None and before[0] == now[0]):
        return []  # (a resumed run's Event is Resumed)
    return [("Normal", "Pending", f"no pod of the run runs yet: {now[1]} ({now[0]})")]


def events_for(decision: Decision, applied: list[Action]) -> list[tuple[str, str, str]]:
    """The decision's Events, without TrainerCreated for a create that was not sent (already in flight)."""
    sent = {a.name for a in applied if a.verb == "create" and a.plural == "jobs"}
    return [e for e in decision.events if e[1] != "TrainerCreated" or any(f"Job {n} created" in e[2] for n in sent)]


def _finish(
    ref: builders.RunRef,
    prev: dict[str, Any],
    run_status: RLTRunStatus,
    plan: _Plan,
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
    events = transition_events(previous_status(prev), run_status, ref.namespace)
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


# The status fields the operator owns (a merge patch removes one of these when a status drops it): the typed model's.
OWN_STATUS_FIELDS = tuple(f.alias or name for name, f in status_model.RLTRunStatus.model_fields.items())


# Progress fields that change at every read (its time, the token rate): alone, written at most every
# PROGRESS_WRITE_SECONDS, so that a watch (`kubectl get rlt -w`) gets a line when something visible changed.
QUIET_PROGRESS = ("updateTime", "tokensPerSecond")
PROGRESS_WRITE_SECONDS = 120.0


def status_patch(prev: dict[str, Any], new: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    """The status write from `prev` (the server's) to `new`: merge_patch, or nothing while only the progress's read
    time or token rate changed and the server's progress is younger than PROGRESS_WRITE_SECONDS."""
    patch = merge_patch(prev, new)
    if set(patch) != {"progress"}:
        return patch
    before, after = prev.get("progress") or {}, new.get("progress") or {}
    written = parse_time(before.get("updateTime"))

    def loud(p: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in p.items() if k not in QUIET_PROGRESS}

    if loud(before) == loud(after) and written and (now - written).total_seconds() < PROGRESS_WRITE_SECONDS:
        return {}
    return patch


def merge_patch(prev: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch from `prev` to `new` at the top level (None removes one of our fields)."""
    patch = {k: v for k, v in new.items() if prev.get(k) != v}
    for k, v in patch.items():  # a merge patch merges maps: a key gone from a map of ours is removed explicitly
        if isinstance(v, dict) and isinstance(prev.get(k), dict):
            patch[k] = {**{gone: None for gone in prev[k] if gone not in v}, **v}
    for k in prev:
        if k not in new and k in OWN_STATUS_FIELDS:
            patch[k] = None
    return patch
