"""What the operator sees of a run's children: the summary of each (what its indices keep), pod problems,
Job completion and failure."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlt.checks.driver import DRIVER_PREFIX
from rlt.contract import env as pod_env
from rlt.contract.exitcodes import CAPACITY_PREFIX, DISRUPTION, FAIL_FAST
from rlt_operator import builders


def summarize(plural: str, body: dict[str, Any]) -> dict[str, Any]:
    """The few fields of a child the decision needs (what the operator's indices keep in memory)."""
    meta = body.get("metadata") or {}
    out: dict[str, Any] = {
        "name": meta.get("name"),
        "labels": dict(meta.get("labels") or {}),
        "deleting": bool(meta.get("deletionTimestamp")),
        "owner": next((r.get("uid") for r in meta.get("ownerReferences") or [] if r.get("controller")), None),
    }
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    if plural == "persistentvolumeclaims":
        out["phase"] = status.get("phase")
    elif plural in ("configmaps", "networkpolicies"):
        out["configHash"] = (meta.get("annotations") or {}).get(builders.A_CONFIG_HASH)
    elif plural in _BY_KIND:
        _BY_KIND[plural](out, meta, spec, status)
    return out


def _job(out: dict[str, Any], meta: dict[str, Any], spec: dict[str, Any], status: dict[str, Any]) -> None:
    out["uid"] = meta.get("uid")  # to find its controller's FailedCreate Events (pods_not_created)
    out["completions"] = spec.get("completions", 1)
    out["active"] = int(status.get("active") or 0)  # Pending pods too
    out["ready"] = int(status.get("ready") or 0)  # pods whose containers run (and pass their readiness probe)
    out["succeeded"] = int(status.get("succeeded") or 0)
    out["failed"] = int(status.get("failed") or 0)
    out["conditions"] = [
        {k: c.get(k) for k in ("type", "status", "reason", "message", "lastTransitionTime")}
        for c in status.get("conditions") or []
    ]
    # The spec the gang was created with (its pods' RLT_RUN_YAML): what it runs, whatever the spec says now.
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    env = (containers[0].get("env") or []) if containers else []
    out["snapshot"] = next((e.get("value") for e in env if e.get("name") == pod_env.RUN_YAML.name), None)
    # Kueue evicts (preemption, lost admission) by suspending the Job: its pods are deleted without a
    # DisruptionTarget condition, so the Job's own state is what says their end was a disruption.
    out["suspended"] = bool(spec.get("suspend")) or any(
        c.get("type") == "Suspended" and c.get("status") == "True" for c in status.get("conditions") or []
    )


def _statefulset(out: dict[str, Any], meta: dict[str, Any], spec: dict[str, Any], status: dict[str, Any]) -> None:
    out["uid"] = meta.get("uid")
    out["replicas"] = spec.get("replicas", 1)
    out["readyReplicas"] = int(status.get("readyReplicas") or 0)
    out["createdReplicas"] = int(status.get("replicas") or 0)  # pods the controller has created


def _pod(out: dict[str, Any], meta: dict[str, Any], spec: dict[str, Any], status: dict[str, Any]) -> None:
    out["phase"] = status.get("phase")
    out["finalizers"] = list(meta.get("finalizers") or [])  # a kept pod sheds its Job's (gang.kept_pod_patch)
    out["node"] = spec.get("nodeName")
    # Scheduled: a node is assigned (PodScheduled=True, nodeName, or the kubelet already ran it). A pod no
    # scheduler has touched (its schedulerName's scheduler is not running) has neither condition nor node.
    out["scheduled"] = (
        bool(spec.get("nodeName"))
        or out["phase"] in ("Running", "Succeeded", "Failed")
        or any(c.get("type") == "PodScheduled" and c.get("status") == "True" for c in status.get("conditions") or [])
    )
    if spec.get("schedulerName") not in (None, "default-scheduler"):
        out["schedulerName"] = spec["schedulerName"]
    # Set at deletion to now + the grace period: a pod still there well after it is stuck (a NotReady node).
    out["deletionTimestamp"] = meta.get("deletionTimestamp")
    containers = (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
    out["restarts"] = sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or [])
    out["problem"] = pod_problem(status, containers)
    # Scheduled but no sandbox yet: the kubelet waits for the pod's volumes to attach and mount before it
    # creates the sandbox (image pulls come after), so a long wait here is a volume that cannot attach.
    conds = {c.get("type"): c for c in status.get("conditions") or []}
    waiting = conds.get("PodReadyToStartContainers") or {}
    if (conds.get("PodScheduled") or {}).get("status") == "True" and waiting.get("status") == "False":
        out["sandboxWaitingSince"] = waiting.get("lastTransitionTime")
    codes = [
        t.get("exitCode")
        for c in containers
        for t in ((c.get("state") or {}).get("terminated"),)
        if t and t.get("exitCode")
    ]
    out["exitCode"] = int(codes[0]) if codes else None
    # A container the kubelet restarted in place (a generator's vLLM: restartPolicy Always) keeps its last end in
    # lastState: a config error there (the driver check's 78) fails the run as the trainer's own does.
    out["failFast"] = fail_fast_exit(containers)
    # What the failed container said (terminationMessagePolicy FallbackToLogsOnError: its log's tail)
    out["lastError"] = last_error_line(
        next(
            (
                t.get("message")
                for c in containers
                if (t := (c.get("state") or {}).get("terminated")) and t.get("exitCode") and t.get("message")
            ),
            None,
        )
    )
    # The failed container's end in full (its log's tail): copied to a retained ConfigMap (rlt_operator.apply.evidence).
    out["ended"] = next(
        (
            {"container": c.get("name"), **{k: t.get(k) for k in ("exitCode", "reason", "message", "finishedAt")}}
            for c in containers
            if (t := (c.get("state") or {}).get("terminated")) and t.get("exitCode")
        ),
        None,
    )
    # The preflight's capacity line (rlt.checks.preflight writes it to its termination message whatever its exit
    # code): the plan fits, was not checked, or does not fit (gang.capacity_condition).
    out["capacity"] = capacity_line(status.get("initContainerStatuses") or [])
    # Preemption, node drain, eviction, or a trainer that saved and stopped on SIGTERM: the pod did nothing
    # wrong (podFailurePolicy Ignore, not counted).
    out["disrupted"] = out["exitCode"] in DISRUPTION or any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in status.get("conditions") or []
    )


_BY_KIND: dict[str, Callable[[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]], None]] = {
    "jobs": _job,
    "statefulsets": _statefulset,
    "pods": _pod,
}


# A line of a Python exception (`RuntimeError: CUDA error: ...`, `torch.OutOfMemoryError: ...`, a bare `KeyboardInterrupt`).
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Failure|Timeout)\b(:|$)")
# torch.distributed's excepthook starts each line of a rank's traceback with its rank.
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ")
# What torchrun raises when a rank failed: the rank's own exception, above it, says why.
_LAUNCHER_FAILED = "ChildFailedError"
# Lines that say where the process was, not why it ended: rlt's trace lines (rlt.stages.record.trace_line), torch
# elastic's report frame, rank-prefixed log lines of the launcher.
_NOT_A_CAUSE = re.compile(r"^(rlt-world |[=-]{8,}|\[rank\d+\]:\[[WI]|[WI]\d{4} \d|\[[\d/]+\] )")


def last_error_line(message: str | None) -> str | None:
    """Why a container failed, from its terminated message (the log's tail, terminationMessagePolicy
    FallbackToLogsOnError): rlt's own one-line error ('rlt stage: ...', the preflight's 'capacity: ...') when there
    is one, else the last exception line, else the last line that is not a trace line (None when the tail has only
    those: the exit code then says what is known)."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith(("rlt ", "/etc/rlt/", CAPACITY_PREFIX, DRIVER_PREFIX))]
    # a rank's exception ("[rank1]: RuntimeError: ...") before the launcher's report that a rank failed
    raised = [line for line in lines if _EXCEPTION.match(_RANK_PREFIX.sub("", line))]
    raised = [line for line in raised if _LAUNCHER_FAILED not in line] or raised
    plain = [line for line in lines if not _NOT_A_CAUSE.match(line)]
    found = ours or raised or plain
    if not found:
        return None
    line = found[-1]
    return line if len(line) <= 400 else line[:397] + "..."


def fail_fast_exit(containers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """{exitCode, lastError} of a container whose current or last run ended with a config/data error code
    (FAIL_FAST: retrying cannot help), else None."""
    for c in containers:
        for state in ((c.get("state") or {}).get("terminated"), (c.get("lastState") or {}).get("terminated")):
            if state and state.get("exitCode") in FAIL_FAST:
                return {"exitCode": int(state["exitCode"]), "lastError": last_error_line(state.get("message"))}
    return None


def capacity_line(init_containers: list[dict[str, Any]]) -> str | None:
    """The last line starting with CAPACITY_PREFIX in a terminated init container's message, if any."""
    for c in init_containers:
        message = ((c.get("state") or {}).get("terminated") or {}).get("message") or ""
        lines = [line.strip() for line in message.splitlines() if line.strip().startswith(CAPACITY_PREFIX)]
        if lines:
            return lines[-1] if len(lines[-1]) <= 1000 else lines[-1][:997] + "..."
    return None


# Container states that leave a pod stuck or crashing: the reason is surfaced on the RLTRun as it is.
STUCK_WAITING = (
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
)


def pod_problem(status: dict[str, Any], containers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Why a pod cannot run: {kind: Unschedulable|Container, reason, message, exitCode?} or None."""
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return {
                "kind": "Unschedulable",
                "reason": c.get("reason") or "Unschedulable",
                "message": c.get("message") or "no node fits the pod",
                "since": c.get("lastTransitionTime"),
            }
    for c in containers:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_WAITING:
            last = (c.get("lastState") or {}).get("terminated") or {}
            reason = "OOMKilled" if last.get("reason") == "OOMKilled" else waiting["reason"]
            return {
                "kind": "Container",
                "reason": reason,
                "message": f"container {c.get('name')}: {waiting.get('message') or reason}",
            }
        for state in ((c.get("state") or {}).get("terminated"), (c.get("lastState") or {}).get("terminated")):
            if state and state.get("reason") == "OOMKilled":
                return {
                    "kind": "Container",
                    "reason": "OOMKilled",
                    "exitCode": state.get("exitCode"),
                    "message": f"container {c.get('name')} ran out of memory (OOMKilled): raise its memory "
                    "limit in spec.resources",
                }
    return None


@dataclass
class Observed:
    """Children of one run, by name (pods as a list), as summaries from `summarize`."""

    configmaps: dict[str, dict[str, Any]] = field(default_factory=dict)
    persistentvolumeclaims: dict[str, dict[str, Any]] = field(default_factory=dict)
    services: dict[str, dict[str, Any]] = field(default_factory=dict)
    statefulsets: dict[str, dict[str, Any]] = field(default_factory=dict)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)
    networkpolicies: dict[str, dict[str, Any]] = field(default_factory=dict)

    def child(self, plural: str, name: str) -> dict[str, Any] | None:
        """The summary of the child `plural/name`, or None."""
        if plural == "pods":
            return next((p for p in self.pods if p["name"] == name), None)
        children: dict[str, dict[str, Any]] = getattr(self, plural)
        return children.get(name)


def pods_not_created(observed: Observed) -> list[tuple[str, str, str]]:
    """(kind, name, uid) of the run's Jobs and StatefulSets whose controller has not created all their pods: where
    a FailedCreate Event (a missing PriorityClass or ServiceAccount, a ResourceQuota, a LimitRange, an admission
    webhook) says why no pod exists."""
    out = []
    for name, job in observed.jobs.items():
        if job.get("deleting") or job.get("suspended") or job_complete(job) or job_failure(job) or not job.get("uid"):
            continue
        if job.get("active", 0) + job.get("succeeded", 0) < job.get("completions", 1):
            out.append(("Job", name, job["uid"]))
    for name, sts in observed.statefulsets.items():
        if not sts.get("deleting") and sts.get("uid") and sts.get("createdReplicas", 0) < sts.get("replicas", 1):
            out.append(("StatefulSet", name, sts["uid"]))
    return out


def failed_create(kind: str, name: str, events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest FailedCreate Event of a controller (core v1 Events) as a problem {reason, message, about}, or None
    (`about`: the controller, which the run's Event is keyed by: each retry's message names a new pod)."""
    failed = [e for e in events if e.get("reason") == "FailedCreate"]
    if not failed:
        return None

    def when(e: dict[str, Any]) -> str:
        series = e.get("series") or {}
        return str(series.get("lastObservedTime") or e.get("lastTimestamp") or e.get("eventTime") or "")

    newest = max(failed, key=when)
    message = f"{kind} {name}: {newest.get('message') or 'cannot create pods'}"
    return {"reason": "FailedCreate", "message": message, "about": f"{kind} {name}"}


def condition_true(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    conditions: list[dict[str, Any]] = obj.get("conditions", [])
    for c in conditions:
        if c.get("type") == type_ and c.get("status") == "True":
            return c
    return None


def job_failing(job: dict[str, Any] | None) -> dict[str, Any] | None:
    """The condition that says the Job failed: Failed, or the FailureTarget that Kubernetes 1.31+ writes first
    while the other pods stop; None while it has not."""
    if not job:
        return None
    return condition_true(job, "FailureTarget") or condition_true(job, "Failed")


# Set on a failing Job's summary by the run's loop (rlt_operator.reconcile.RunMemory.stamp_failures): when this
# operator first saw it failing, by its own clock.
FAILURE_SEEN = "failureSeen"


def job_complete(job: dict[str, Any] | None) -> bool:
    if not job or job.get("deleting"):
        return False
    return bool(condition_true(job, "Complete")) or job.get("succeeded", 0) >= job.get("completions", 1)


def job_failure(job: dict[str, Any] | None) -> str | None:
    if not job:
        return None
    c = condition_true(job, "Failed")
    if c:
        return f"{c.get('reason') or 'Failed'}: {c.get('message') or 'a trainer pod failed'}"
    if job.get("failed", 0) > 0:
        return f"{job['failed']} trainer pod(s) failed"
    return None
