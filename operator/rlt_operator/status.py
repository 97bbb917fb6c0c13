"""Pure reconcile logic: (spec, previous status, observed children, now) → new status + actions.

Level-based: every call recomputes the status from the children that exist now. The previous
status contributes only what children cannot show: the restart count, the start/completion
times, stages already finished whose Jobs were cleaned up, and terminal phases (which stick).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from rlt.checks.validation import validate_spec
from rlt.contract.api import TERMINAL_PHASES, Phase
from rlt.contract.layout import format_time, parse_time
from rlt.spec.fingerprint import describe_changes, fingerprint_of, stage_fields
from rlt.spec.loading import SpecError
from rlt.spec.run import RLTRunSpec, needs_generators
from rlt_operator import builders, status_model
from rlt_operator.conditions import (
    no_pods,
    pod_conditions,
    set_condition,
    stuck_terminating,
    volume_condition,
)
from rlt_operator.gang import capacity_condition, gang_failure, trainer_shape
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
        child = getattr(self.obs, plural).get(name)
        if child is not None and not child.get("deleting"):
            if not any(a.verb == "delete" and a.name == name and a.plural == plural for a in self.actions):
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
    """`scrapers`: namespaces whose Prometheus may reach the generators' port 8000 (OperatorSettings.scrapers)."""
    prev = dict(prev or {})
    run_status = previous_status(prev)
    run_status.phase = run_status.phase or PENDING
    run_status.stage = run_status.stage or ""
    run_status.observed_generation = generation
    run_status.restarts = run_status.restarts or 0
    run_status.disruptions = run_status.disruptions or 0
    run_status.completed_stages = list(run_status.completed_stages or [])
    run_status.stage_specs = dict(run_status.stage_specs or {})
    run_status.progress = run_status.progress or Progress()
    run_status.outputs = run_status.outputs or Outputs()  # recomputed below; kept as is while the spec is invalid
    conds = run_status.conditions = run_status.conditions or []
    if not run_status.reason:
        run_status.reason = run_status.message = None
    else:
        run_status.message = run_status.message or ""
    plan = _Plan(observed)
    gen_name = builders.generator_name(ref.name)

    # A run failed as InvalidSpec by an older operator recovers too: invalid specs are not terminal now.
    if run_status.phase == FAILED and run_status.reason == "InvalidSpec":
        run_status.phase = PENDING
        run_status.reason = run_status.message = None
        conds = run_status.conditions = [c for c in conds if c.type != ConditionType.FAILED]
    try:
        spec = validate_spec(raw_spec, name=ref.name, source=f"rltrun/{ref.name}")
    except SpecError as err:
        # The same check as `rlt validate`. Hold: nothing is started or stopped (the pods keep the last valid
        # spec in their ConfigMap); the condition says why, and fixing the spec resumes from here.
        message = "; ".join(err.problems)
        if run_status.phase not in TERMINAL:
            run_status.reason, run_status.message = "InvalidSpec", message
        set_condition(conds, ConditionType.SPEC_VALID, False, "InvalidSpec", message, now)
        return _finish(prev, run_status, plan, None)
    set_condition(conds, ConditionType.SPEC_VALID, True, "Valid", "the spec passes rlt validate", now)

    enabled = spec.stages.enabled()

    # Run-wide children: the pods' config (kept equal to the spec) and the data claim.
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

    # Stages whose Job completed (or completed before and was cleaned up) are done.
    done = [
        s
        for s in enabled
        if s in run_status.completed_stages or job_complete(observed.jobs.get(builders.trainer_name(ref.name, s)))
    ]
    run_status.completed_stages = done
    run_status.outputs = Outputs.model_validate(builders.outputs(ref.name, spec, done))
    finished_stage_edits(run_status, spec, done, now)

    if run_status.phase not in TERMINAL:
        start = parse_time(run_status.start_time)
        deadline = spec.active_deadline_seconds
        # Completion first: a run whose last Job completed in time but is observed after the deadline
        # (operator down, slow watch) is done, not DeadlineExceeded.
        if len(done) == len(enabled):
            message = "all stages finished: " + ", ".join(enabled)
            run_status.phase, run_status.stage = SUCCEEDED, ""
            run_status.reason, run_status.message = "Succeeded", message
            set_condition(conds, ConditionType.COMPLETE, True, "Succeeded", message, now)
        elif start and deadline and (now - start).total_seconds() >= deadline and not spec.suspend:
            _fail(
                run_status,
                "DeadlineExceeded",
                f"the run was active longer than activeDeadlineSeconds ({deadline}s)",
                now,
            )
    if run_status.phase in TERMINAL:
        return _finish(prev, run_status, plan, _terminal(ref, spec, run_status, plan, observed, now))

    stage = next(s for s in enabled if s not in done)
    if stage != run_status.stage:
        run_status.progress = Progress()
        run_status.trainer_shape = None
    run_status.stage = stage
    job_name = builders.trainer_name(ref.name, stage)
    restarts = run_status.restarts

    # The running stage was disabled, or an earlier one enabled: a trainer of another stage that is still
    # active stops first (the run always runs the first enabled, unfinished stage; one stage at a time).
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

    # Suspend: every GPU pod goes, the data and config stay; resuming restarts from the last checkpoint.
    if spec.suspend:
        plan.delete("jobs", job_name, "Foreground")
        plan.delete("statefulsets", gen_name, "Foreground")
        run_status.phase, run_status.start_time = SUSPENDED, None
        run_status.reason, run_status.message = "Suspended", "spec.suspend is true"
        set_condition(conds, ConditionType.SUSPENDED, True, "Suspended", "all GPU pods deleted; data kept", now)
        no_pods(run_status, "Suspended", f"stage {stage}: suspended (spec.suspend)", now)
        return _finish(prev, run_status, plan, None)
    if run_status.phase == SUSPENDED:
        set_condition(conds, ConditionType.SUSPENDED, False, "Resumed", "resuming from the last checkpoint", now)
        run_status.phase = PENDING
    run_status.reason = run_status.message = None
    if not run_status.start_time:
        run_status.start_time = format_time(now)
    requeue: float | None = None
    if spec.active_deadline_seconds:
        started = parse_time(run_status.start_time)
        assert started is not None
        requeue = max(0.0, spec.active_deadline_seconds - (now - started).total_seconds())

    # Children of another stage or of an older gang are stale: delete them and wait until gone.
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

    # Running once a trainer of the run has existed; Pending before (e.g. while vLLM loads the model).
    if job is not None or done or run_status.phase == RUNNING:
        run_status.phase = RUNNING

    # A failure anywhere in the current gang restarts the whole gang (trainer and generators), except a
    # config/data error of the trainer (retrying cannot help: fail now) and a disruption (restart, uncounted).
    one_node = spec.storage.access_mode == "ReadWriteOnce" and gens_needed
    failure, fatal, disrupted = gang_failure(job, job_name, observed.pods, stage, restarts, now, one_node)
    capacity_condition(run_status, observed.pods, stage, restarts, now)
    if fatal:
        _fail(
            run_status,
            "ConfigError",
            f"{fatal}; not retried (fix the spec or the data, then create the run again)",
            now,
        )
        return _finish(prev, run_status, plan, _terminal(ref, spec, run_status, plan, observed, now))
    if failure:
        counted = restarts - (run_status.disruptions or 0)
        if disrupted or counted < spec.backoff_limit:
            run_status.restarts = restarts + 1
            if disrupted:
                run_status.disruptions = (run_status.disruptions or 0) + 1
            plan.delete("jobs", job_name, "Foreground")
            plan.delete("statefulsets", gen_name, "Foreground")
            set_condition(conds, ConditionType.TRAINER_RUNNING, False, "GangRestart", failure, now)
            run_status.last_failure = failure
            return _finish(prev, run_status, plan, SOON)
        _fail(
            run_status,
            "BackoffLimitExceeded",
            f"{failure}; gang restarts exhausted (backoffLimit {spec.backoff_limit})",
            now,
        )
        return _finish(prev, run_status, plan, _terminal(ref, spec, run_status, plan, observed, now))

    # Generators first; the trainer joins them only once every server answers /health.
    ready = True
    if gens_needed:
        plan.ensure("networkpolicies", builders.generator_network_policy(ref, spec, scrapers))
        plan.ensure("services", builders.generator_service(ref, spec, stage, restarts))
        if sts is None and not waiting:
            plan.ensure("statefulsets", builders.generator_statefulset(ref, spec, stage, restarts))
        want = spec.resources.generator.replicas
        have = sts["readyReplicas"] if sts else 0
        ready = sts is not None and have >= want
        set_condition(
            conds,
            ConditionType.GENERATORS_READY,
            ready,
            "Ready" if ready else "Starting",
            f"{have}/{want} vLLM servers ready",
            now,
        )
    if ready and not waiting:
        plan.ensure("services", builders.trainer_service(ref, run_spec, stage, restarts))
        if job is None:
            plan.ensure("jobs", builders.trainer_job(ref, run_spec, stage, restarts))
    # Job.status.active counts Pending pods too: the trainer runs once every one of its pods does.
    gang = [
        p
        for p in observed.pods
        if p["labels"].get(builders.L_STAGE) == stage and p["labels"].get(builders.L_RESTART) == str(restarts)
    ]
    want_pods = int(job.get("completions", 1)) if job else 0
    running_pods = sum(
        1 for p in gang if p["labels"].get(builders.L_ROLE) == builders.ROLE_TRAINER and p.get("phase") == "Running"
    )
    active = bool(job and job.get("active", 0) > 0) and running_pods >= want_pods
    why = (
        "trainer running"
        if active
        else "trainer Job suspended (Kueue: waiting to be admitted again)"
        if job and job.get("suspended")
        else "waiting for generators"
        if not ready
        else f"{running_pods}/{want_pods} trainer pods running"
        if job
        else "trainer starting"
    )
    set_condition(
        conds,
        ConditionType.TRAINER_RUNNING,
        active,
        "Running" if active else "Waiting",
        f"stage {stage}: {why}",
        now,
    )
    # A restart waiting on an old gang's pod that never goes (its node is NotReady) says so (docs/operator.md).
    pod_conditions(run_status, gang, now, stuck_terminating(observed.pods, now) if waiting else None)
    if progress is not None and progress.get("stage", stage) == stage:
        read = Progress.model_validate({k: v for k, v in progress.items() if k != "stage"})
        if read.step is not None:
            read.step_of_total = f"{read.step}/{read.total_steps}" if read.total_steps else str(read.step)
        run_status.progress = read
    return _finish(prev, run_status, plan, _min(requeue, SOON if waiting else None))


def finished_stage_edits(run_status: RLTRunStatus, spec: RLTRunSpec, done: list[str], now: dt.datetime) -> None:
    """Record the spec each stage finished under (status.stageSpecs) and report a later edit of it.

    A finished stage is never re-run by the operator: an edit of the fields its output depends on is not
    applied, so the condition StagesCurrent says so, naming the changed fields (docs/operator.md)."""
    records = {s: r for s, r in (run_status.stage_specs or {}).items() if s in done}
    edits = []
    for stage in done:
        fields = stage_fields(spec, stage)
        record = records.get(stage)
        if record is None:  # finished now (or before the operator recorded stage specs): this spec is its spec
            records[stage] = StageSpec(
                fingerprint=fingerprint_of(fields), fields={k: json.dumps(v) for k, v in fields.items()}
            )
        elif record.fingerprint != fingerprint_of(fields):
            old = {k: json.loads(v) for k, v in record.fields.items()}
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
    run_status.stage = ""
    run_status.trainer_shape = None
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


def transition_events(prev: RLTRunStatus, new: RLTRunStatus) -> list[tuple[str, str, str]]:
    """Kubernetes Events for what changed between two statuses."""
    ev: list[tuple[str, str, str]] = []
    if (new.restarts or 0) > (prev.restarts or 0):
        uncounted = (new.disruptions or 0) > (prev.disruptions or 0)
        ev.append(
            (
                "Warning",
                "GangRestart",
                f"restart {new.restarts}: {new.last_failure or 'a pod failed'}; "
                "trainer and generators restart from the last checkpoint"
                + (" (a disruption: not counted against backoffLimit)" if uncounted else ""),
            )
        )
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
            ev.append(("Warning", new.reason or "Failed", new.message or "run failed"))
        elif new.phase == SUCCEEDED:
            ev.append(("Normal", "Succeeded", new.message or "run succeeded"))
        elif new.phase == SUSPENDED:
            ev.append(("Normal", "Suspended", "GPU pods deleted; data kept"))
        elif prev.phase == SUSPENDED:
            ev.append(("Normal", "Resumed", "resuming from the last checkpoint"))
        elif new.phase == RUNNING:
            ev.append(("Normal", "Running", f"the run is running (stage {new.stage})"))
    return ev


def events_for(decision: Decision, applied: list[Action]) -> list[tuple[str, str, str]]:
    """The decision's Events, without TrainerCreated for a create that was not sent (already in flight)."""
    sent = {a.name for a in applied if a.verb == "create" and a.plural == "jobs"}
    return [e for e in decision.events if e[1] != "TrainerCreated" or any(f"Job {n} created" in e[2] for n in sent)]


def _finish(prev: dict[str, Any], run_status: RLTRunStatus, plan: _Plan, requeue: float | None) -> Decision:
    # Empty records are left out of the written status (a merge patch then removes them).
    if not run_status.last_failure:
        run_status.last_failure = None
    if not run_status.stage_specs:
        run_status.stage_specs = None
    status = run_status.model_dump(mode="json", by_alias=True, exclude_none=True)
    status_model.check(status)  # a field the CRD does not list would be pruned by the API server
    events = transition_events(previous_status(prev), run_status)
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
