"""The steps of status.decide that concern the current stage's gang (its trainer Job and generators): which
children are stale, whether it failed and restarts, what edits it does not run yet, launching it, and whether
its trainer runs."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from rlt.contract.layout import format_time, parse_time
from rlt.spec.fingerprint import describe_changes, flat_spec
from rlt.spec.run import RLTRunSpec, needs_generators
from rlt_operator import builders
from rlt_operator.status.conditions import (
    WAITING_FOR_FAILED_POD,
    has_condition,
    pod_conditions,
    set_condition,
    stuck_terminating,
)
from rlt_operator.status.decision import FAILED, RUNNING, Action, Plan, fail
from rlt_operator.status.gang import (
    capacity_condition,
    current_gang,
    failed_trainer_pod,
    gang_failure,
    kept_pod_patch,
    placement_timeout,
    pods_behind_job,
    trainer_shape,
)
from rlt_operator.status.model import ConditionType, RLTRunStatus
from rlt_operator.status.observed import Observed
from rlt_operator.status.records import spec_of

# After the n-th counted gang failure the next gang waits BACKOFF_BASE * 2**(n-1) s, at most BACKOFF_CAP (the Job
# controller's pod back-off, shorter: a gang restart already costs a model load); a disruption restarts at once.
BACKOFF_BASE, BACKOFF_CAP = 10.0, 300.0

# The grace period of a gang's live trainer pods once a trainer pod of it has failed: they cannot save (a ZeRO
# checkpoint is a collective of every rank, and a rank is gone), and under NCCL they do not notice the lost peer
# before the process group's timeout, so the pods' own grace period (sized for a save: up to 35 min) would only
# hold the GPUs and the restart. A preemption, eviction, drain or suspend keeps the full grace: every rank lives
# and saves.
LOST_PEER_GRACE_SECONDS = 10


def restart_delay(counted_failures: int) -> float:
    """Seconds the next gang waits after the `counted_failures`-th failure (0: none yet)."""
    if counted_failures <= 0:
        return 0.0
    return min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** min(counted_failures - 1, 30))


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
    plan: Plan,
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
POD_LAG = "PodLag"  # gang_outcome: its Job failed, its failed pod is not seen yet (pods_behind_job): decide soon


def keep_failed_pod(ref: builders.RunRef, gang: Gang, run_status: RLTRunStatus, observed: Observed, plan: Plan) -> None:
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


def prune_kept_pods(ref: builders.RunRef, run_status: RLTRunStatus, plan: Plan) -> None:
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
    plan: Plan,
    now: dt.datetime,
) -> str | None:
    """A failure anywhere in the current gang restarts the whole gang (trainer and generators), except a
    config/data error of any of its pods (retrying cannot help: fail now); a disruption restarts it uncounted, and
    a ReadWriteOnce re-placement counts against spec.replacementLimit instead of spec.backoffLimit.
    Returns RESTART, FAILED, POD_LAG, or None (the gang goes on)."""
    stage, restarts = gang.stage, gang.restarts
    if pods_behind_job(gang.job, observed.pods, stage, restarts, now) is not None:
        why = f"stage {stage}: trainer Job failed; waiting a few seconds for its failed pod to be seen, to keep its log"
        set_condition(
            run_status.conditions or [], ConditionType.TRAINER_RUNNING, False, WAITING_FOR_FAILED_POD, why, now
        )
        return POD_LAG
    live = gang.sts is not None
    failure, fatal, disrupted = gang_failure(gang.job, gang.job_name, observed.pods, stage, restarts, live)
    capacity_condition(run_status, observed.pods, stage, restarts, now)
    if fatal or failure:
        keep_failed_pod(ref, gang, run_status, observed, plan)
    if fatal:
        fail(
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
        fail(run_status, "ReplacementLimitExceeded", message, now)
        return FAILED
    counted = restarts - (run_status.disruptions or 0) - replacements
    if not (disrupted or counted < spec.backoff_limit):
        message = f"{failure}; gang restarts exhausted (backoffLimit {spec.backoff_limit})"
        fail(run_status, "BackoffLimitExceeded", message, now)
        return FAILED
    run_status.restarts = restarts + 1
    if replaced:
        run_status.replacements = replacements + 1
    elif disrupted:
        run_status.disruptions = (run_status.disruptions or 0) + 1
    delay = 0.0 if disrupted else restart_delay(counted + 1)
    run_status.backoff_until = format_time(now + dt.timedelta(seconds=delay)) if delay else None
    plan.delete("jobs", gang.job_name, "Foreground")
    if not disrupted:
        for name in lost_peer_survivors(observed.pods, stage, restarts):
            plan.delete("pods", name, grace_seconds=LOST_PEER_GRACE_SECONDS)
    plan.delete("statefulsets", gang.gen_name, "Foreground")
    set_condition(run_status.conditions or [], ConditionType.TRAINER_RUNNING, False, "GangRestart", failure, now)
    run_status.last_failure = failure
    return RESTART


def lost_peer_survivors(pods: list[dict[str, Any]], stage: str, restarts: int) -> list[str]:
    """The current gang's live trainer pods when another trainer pod of it failed (not a stop after a save or a
    disruption): they are deleted with LOST_PEER_GRACE_SECONDS instead of their own grace period."""
    trainers = [
        p for p in current_gang(pods, stage, restarts) if p["labels"].get(builders.L_ROLE) == builders.ROLE_TRAINER
    ]
    # `disrupted`: a stop after a save (exit STOPPED) or a DisruptionTarget condition (observed._pod)
    lost = any(p.get("phase") == "Failed" and not p.get("disrupted") for p in trainers)
    return [p["name"] for p in trainers if lost and p.get("phase") in ("Pending", "Running")]


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
    old, new = spec_of(ran), spec_of(now_text)
    if old is None or new is None:
        return "the spec"

    def gang_fields(spec: RLTRunSpec) -> dict[str, Any]:
        return {
            k: v
            for k, v in flat_spec(spec).items()
            if k not in APPLIED_AT_ONCE and not k.startswith("storage.") and not k.endswith(".enabled")
        }

    before, after = gang_fields(old), gang_fields(new)
    # compare_all: a loggingSteps edit leaves finished stages current, but the running gang still logs at the old one
    return describe_changes(before, after, compare_all=True) if before != after else None


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
    plan: Plan,
    scrapers: tuple[str, ...],
    now: dt.datetime,
) -> bool:
    """Generators first; the trainer joins them only once every server answers /health. True when they are ready
    (or not needed)."""
    stage, restarts = gang.stage, gang.restarts
    ready = True
    if gang.gens_needed:
        plan.keep_current("networkpolicies", builders.generator_network_policy(ref, spec, scrapers), "spec")
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


def _foreign(child: dict[str, Any], ref: builders.RunRef) -> bool:
    """A GPU child of an earlier RLTRun with the same name (deleted and re-created): never adopt it."""
    return child.get("owner") not in (None, ref.uid)
