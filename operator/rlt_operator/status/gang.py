"""The current stage's trainer gang: the shape it runs with and why it failed."""

from __future__ import annotations

import datetime as dt
from typing import Any

from rlt.contract.exitcodes import (
    CAPACITY_FITS,
    CAPACITY_NOT_CHECKED,
    CAPACITY_PREFIX,
    DISRUPTION,
    FAIL_FAST,
    ExitCode,
)
from rlt.contract.layout import parse_time
from rlt.spec.run import RLTRunSpec
from rlt_operator import builders
from rlt_operator.status.conditions import RWO_PLACEMENT_SECONDS, has_condition, set_condition
from rlt_operator.status.model import ConditionType, RLTRunStatus, TrainerShape
from rlt_operator.status.observed import FAILURE_SEEN, condition_true, job_failing, job_failure


def trainer_shape(spec: RLTRunSpec, stage: str, run_status: RLTRunStatus, now: dt.datetime) -> TrainerShape:
    """The nodes x gpus the current stage's trainer runs with (kept in status.trainerShape)."""
    want = TrainerShape(stage=stage, nodes=spec.resources.trainer.nodes, gpus=spec.resources.trainer.gpus)
    had = run_status.trainer_shape
    conds = run_status.conditions = run_status.conditions or []
    checkpointed = bool(run_status.progress and run_status.progress.last_checkpoint)
    if had is not None and had.stage == stage and checkpointed and (had.nodes, had.gpus) != (want.nodes, want.gpus):
        set_condition(
            conds,
            ConditionType.SPEC_APPLIED,
            False,
            "ShapeFrozen",
            f"resources.trainer nodes/gpus {want.nodes}x{want.gpus} apply from the next stage: "
            f"stage {stage} has a checkpoint written by {had.nodes}x{had.gpus} (ZeRO checkpoints "
            "resume only with the world size that wrote them)",
            now,
        )
        return had
    if has_condition(run_status, ConditionType.SPEC_APPLIED):
        set_condition(conds, ConditionType.SPEC_APPLIED, True, "Applied", "the trainer runs the spec's shape", now)
    run_status.trainer_shape = want
    return want


def current_gang(pods: list[dict[str, Any]], stage: str, restarts: int) -> list[dict[str, Any]]:
    return [
        p
        for p in pods
        if p["labels"].get(builders.L_STAGE) == stage and p["labels"].get(builders.L_RESTART) == str(restarts)
    ]


def capacity_condition(
    run_status: RLTRunStatus, pods: list[dict[str, Any]], stage: str, restarts: int, now: dt.datetime
) -> None:
    """CapacityOK from the capacity line of the current gang's trainer pods (rlt.checks.preflight, the init container's
    termination message): False (CapacityExceeded) when one exited CONFIG_ERROR with it (the plan of its stage or of
    the volume does not fit); else True (Fits, the plan's headline) when one passed the check; else Unknown
    (NotChecked) when the check was skipped (RLT_CAPACITY_CHECK=false). Left as it was while no preflight of the
    gang has ended: the condition is absent until the first one has."""
    found: tuple[bool | None, str, str] | None = None
    for pod in current_gang(pods, stage, restarts):
        if pod["labels"].get(builders.L_ROLE) != builders.ROLE_TRAINER:
            continue
        misfit = pod.get("lastError") or ""
        if pod.get("exitCode") == ExitCode.CONFIG_ERROR and misfit.startswith(CAPACITY_PREFIX):
            found = (False, "CapacityExceeded", misfit.removeprefix(CAPACITY_PREFIX))
            break  # a misfit of any pod wins
        said = (pod.get("capacity") or "").removeprefix(CAPACITY_PREFIX)
        if said.startswith(CAPACITY_FITS):
            found = (True, "Fits", said.removeprefix(CAPACITY_FITS).removeprefix(f"stage {stage}: "))
        elif said.startswith(CAPACITY_NOT_CHECKED) and found is None:
            found = (None, "NotChecked", f"the capacity check was skipped ({said.removeprefix(CAPACITY_NOT_CHECKED)})")
    if found is not None:
        conds = run_status.conditions = run_status.conditions or []
        status, reason, message = found
        set_condition(conds, ConditionType.CAPACITY_OK, status, reason, f"stage {stage}: {message}", now)


def pod_said(pod: dict[str, Any], named: bool = True) -> str:
    """A failed pod's exit code and last line ('' when it has neither), for messages and Events."""
    said = ": ".join(
        filter(None, [f"exit code {pod['exitCode']}" if pod.get("exitCode") else "", pod.get("lastError")])
    )
    return f"pod {pod['name']} {said}" if said and named else said


def placement_timeout(pods: list[dict[str, Any]], stage: str, restarts: int, now: dt.datetime) -> str | None:
    """Why the current gang must be placed again (None while it need not): with a ReadWriteOnce volume and
    generators every pod of the run goes to the generators' node, and a trainer pod unschedulable there for
    RWO_PLACEMENT_SECONDS releases the gang (a re-placement, bounded by spec.replacementLimit), so the generators
    never hold their GPUs for good while the trainer cannot join them."""
    for pod in current_gang(pods, stage, restarts):
        problem = pod.get("problem") or {}
        since = parse_time(problem.get("since")) if problem.get("kind") == "Unschedulable" else None
        if since is None or pod["labels"].get(builders.L_ROLE) != builders.ROLE_TRAINER:
            continue
        waited = (now - since).total_seconds()
        if waited >= RWO_PLACEMENT_SECONDS:
            return (
                f"trainer pod {pod['name']} unschedulable for {int(waited // 60)} min beside the generators "
                f"(ReadWriteOnce volume: one node for the whole run; {problem.get('message')}): generators "
                "and trainer released to be placed again together"
            )
    return None


def gang_failure(
    job: dict[str, Any] | None,
    job_name: str,
    pods: list[dict[str, Any]],
    stage: str,
    restarts: int,
    generators_live: bool = True,
) -> tuple[str | None, str | None, bool]:
    """(failure, fatal, disrupted) of the current gang: `fatal` when a pod of it (trainer or generator) exited
    with a config/data error code (the trainer Job's podFailurePolicy failed it; a generator's container ended so
    in its current or last run); `disrupted` when the failure is a disruption only. `generators_live`: the gang's
    StatefulSet stands (not being deleted by the operator), so a generator pod that stops was stopped by another."""
    gang = current_gang(pods, stage, restarts)
    for pod in gang:
        # Any pod of the gang: a generator's driver check exits 78 as the trainer's preflight does.
        ended = pod.get("failFast") or (pod if pod.get("exitCode") in FAIL_FAST else None)
        if ended:
            code, role = ExitCode(ended["exitCode"]), pod["labels"].get(builders.L_ROLE)
            said = f": {ended['lastError']}" if ended.get("lastError") else ""  # the pod's own error line
            return (None, f"{role} pod {pod['name']} exited with {code.name} ({int(code)}){said}", False)
    reason = (condition_true(job, "Failed") or {}).get("reason") if job else None
    if reason == "PodFailurePolicy":  # the FailJob rule matched (the pod itself may be gone)
        return None, f"trainer Job {job_name}: {job_failure(job)}", False
    failure = job_failure(job)
    if failure:  # the Job says only that a pod failed: name the pod, its exit code and its last line
        failure += next((f" ({said})" for p in gang if (said := pod_said(p)) and p.get("phase") == "Failed"), "")
    suspended = bool(job and job.get("suspended"))
    why_suspended = "suspended (a Kueue eviction or preemption): its pods were stopped, not failed"
    if failure:
        if suspended:
            return f"trainer Job {job_name} was {why_suspended}", None, True
        return f"trainer Job {job_name}: {failure}", None, False
    for pod in gang:
        role = pod["labels"].get(builders.L_ROLE)
        if role == builders.ROLE_GENERATOR and pod.get("deleting") and generators_live:
            # Someone else stops it (the operator deletes only whole gangs): a disruption. The gang restart sends
            # the trainer SIGTERM now, so it saves at its next boundary while the generator's preStop keeps serving.
            return (
                f"generator pod {pod['name']} is stopping (drained, evicted, preempted or deleted): the trainer "
                "saves at its next boundary while the generators serve its rollout",
                None,
                True,
            )
        if pod.get("phase") == "Failed":
            why = ": ".join(filter(None, [(pod.get("problem") or {}).get("reason"), pod_said(pod, named=False)]))
            if suspended and role == builders.ROLE_TRAINER:
                return f"trainer Job {job_name} was {why_suspended} (pod {pod['name']})", None, True
            if pod.get("disrupted"):
                what = (
                    f"stopped on SIGTERM after saving a checkpoint (exit {pod['exitCode']}: preempted, evicted, "
                    "drained or suspended)"
                    if pod.get("exitCode") in DISRUPTION
                    else "was disrupted (preempted, evicted or its node drained)"
                )
                return f"{role} pod {pod['name']} {what}", None, True
            return f"{role} pod {pod['name']} failed" + (f" ({why})" if why else ""), None, False
        if role == builders.ROLE_GENERATOR and pod.get("restarts", 0) > 0:
            why = (pod.get("problem") or {}).get("reason") or ""
            return (
                f"{role} pod {pod['name']} restarted {pod['restarts']} time(s)" + (f" ({why})" if why else ""),
                None,
                False,
            )
    return None, None, False


# How long a failed Job waits for the operator to see its failed pod: the operator watches pods and Jobs on separate
# streams, so the Job's failure can arrive before the pod's end, and a restart decided then would lose the pod's log
# (keep_failed_pod) and its exit code (gang_failure). A pod that never shows (deleted) costs this much. Timed from
# the condition's lastTransitionTime or the operator's first sighting of the failure (FAILURE_SEEN, its own clock),
# whichever is earlier: an API server clock ahead of the operator's cannot lengthen the wait past 15 s of the
# operator's time (one behind can shorten it, as can an operator restart long after the failure).
POD_END_LAG_SECONDS = 15.0


def pods_behind_job(
    job: dict[str, Any] | None, pods: list[dict[str, Any]], stage: str, restarts: int, now: dt.datetime
) -> float | None:
    """Seconds left to wait for the current gang's failed pod when its Job already says it failed (Failed, or the
    FailureTarget that Kubernetes 1.31+ writes while the other pods stop) and no pod of the gang is seen ended with
    a failure (a Failed trainer pod, or a pod that exited with a config/data error); None when one is seen, the Job
    has not failed, or the wait is over."""
    failed = job_failing(job)
    if (
        job is None
        or failed is None
        or any(
            (p["labels"].get(builders.L_ROLE) == builders.ROLE_TRAINER and p.get("phase") == "Failed")
            or p.get("failFast")
            or p.get("exitCode") in FAIL_FAST
            for p in current_gang(pods, stage, restarts)
        )
    ):
        return None
    try:
        server = parse_time(failed.get("lastTransitionTime"))
    except ValueError:  # not the API server's form: the operator's sighting alone, or no wait rather than a guess
        server = None
    since = min((t for t in (server, parse_time(job.get(FAILURE_SEEN))) if t), default=None)
    left = POD_END_LAG_SECONDS - ((now - since).total_seconds() if since else POD_END_LAG_SECONDS)
    return left if left > 0 else None


def failed_trainer_pod(pods: list[dict[str, Any]], stage: str, restarts: int) -> str | None:
    """The current gang's failed trainer pod whose log says why (the one gang_failure names first: an exit code or
    a last line, not a disruption), else any failed trainer pod of the gang; None when none has ended. Only
    trainer pods are kept: they have generated names and hold nothing once Failed, while a generator pod's fixed
    name would block its StatefulSet's replacement."""
    failed = [
        p
        for p in current_gang(pods, stage, restarts)
        if p["labels"].get(builders.L_ROLE) == builders.ROLE_TRAINER and p.get("phase") == "Failed"
    ]
    failed.sort(key=lambda p: (p.get("disrupted", False), not pod_said(p), p["name"]))
    return failed[0]["name"] if failed else None


# The Job controller's finalizer on its pods: it lifts it once it has counted the pod, and only from pods that a Job
# controls or no one does.
JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"


def kept_pod_patch(ref: builders.RunRef, finalizers: list[str]) -> dict[str, Any]:
    """The merge patch that keeps a failed pod when its Job is deleted: the run becomes its only owner and its
    controller (a pod no one controls would be adopted back by its still-present Job, and deleted with it), so the
    garbage collector deletes it with the run, not with the Job. Its job-tracking finalizer goes in the same patch:
    the Job controller never lifts it from a pod another kind controls, and the pod could then never be deleted
    (both seen on a real 1.36 control plane, tests/real_cluster)."""
    meta: dict[str, Any] = {"ownerReferences": [builders.owner_reference(ref)]}
    if JOB_TRACKING_FINALIZER in finalizers:
        meta["finalizers"] = [f for f in finalizers if f != JOB_TRACKING_FINALIZER]
    return {"metadata": meta}
