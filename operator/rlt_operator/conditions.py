"""The run's status conditions: timestamps, upserting one condition, and the pod and volume conditions."""

from __future__ import annotations

import datetime as dt
from typing import Any

# A scheduled pod whose volumes are not attached and mounted after this long is reported (VolumeNotAttached).
VOLUME_ATTACH_WAIT = 180.0
# A deleted pod still there this long after its deletionTimestamp (= deletion + grace period) is stuck Terminating.
STUCK_TERMINATING_AFTER = 120.0
# ReadWriteOnce runs: a trainer pod unschedulable this long beside its generators releases the gang (gang.py).
RWO_PLACEMENT_SECONDS = 600.0


def fmt_time(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s: str | None) -> dt.datetime | None:
    if not s:
        return None
    return dt.datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)


def set_condition(
    conds: list[dict[str, Any]], type_: str, status: bool, reason: str, message: str, now: dt.datetime
) -> None:
    """Upsert a condition; lastTransitionTime changes only when its status does."""
    value = "True" if status else "False"
    for c in conds:
        if c["type"] == type_:
            if c["status"] != value:
                c["lastTransitionTime"] = fmt_time(now)
            c.update(status=value, reason=reason, message=message)
            return
    conds.append(
        {"type": type_, "status": value, "reason": reason, "message": message, "lastTransitionTime": fmt_time(now)}
    )


def stuck_terminating(pods: list[dict[str, Any]], now: dt.datetime) -> dict[str, Any] | None:
    """A problem (as pod_problem gives) for the first pod stuck Terminating: on a NotReady node (after a GPU Xid
    error, a kernel hang) the kubelet never confirms the deletion, and a gang restart waits for the old pods."""
    for p in pods:
        at = parse_time(p.get("deletionTimestamp")) if p.get("deleting") else None
        if at is not None and (now - at).total_seconds() >= STUCK_TERMINATING_AFTER:
            return {
                "kind": "Container",
                "reason": "PodStuckTerminating",
                "message": f"stuck Terminating since {fmt_time(at)} on node {p.get('node') or '?'} (probably "
                "NotReady): the gang restart waits until it is gone. If the node is lost and its processes are "
                f"surely stopped, remove it: kubectl delete pod {p['name']} --grace-period=0 --force",
                "pod": p["name"],
            }
    return None


def pod_conditions(
    run_status: dict[str, Any], gang: list[dict[str, Any]], now: dt.datetime, blocked: dict[str, Any] | None = None
) -> None:
    """PodsSchedulable and PodsHealthy from the current gang's pods; the first problem becomes the run's reason.
    `blocked`: a pod of an older gang that the restart waits for (stuck_terminating), reported first."""
    problems = [(p["name"], p["problem"]) for p in gang if p.get("problem")]
    if blocked:
        problems.insert(0, (blocked["pod"], blocked))
    for cond, kind, ok_reason in (
        ("PodsSchedulable", "Unschedulable", "Scheduled"),
        ("PodsHealthy", "Container", "Healthy"),
    ):
        mine = [(name, pr) for name, pr in problems if pr["kind"] == kind]
        if mine:
            name, pr = mine[0]
            more = f" (and {len(mine) - 1} more pod(s))" if len(mine) > 1 else ""
            set_condition(
                run_status["conditions"], cond, False, pr["reason"], f"pod {name}: {pr['message']}{more}", now
            )
            if "reason" not in run_status:
                run_status["reason"], run_status["message"] = pr["reason"], f"pod {name}: {pr['message']}{more}"
        elif gang or any(c["type"] == cond for c in run_status["conditions"]):
            set_condition(
                run_status["conditions"], cond, True, ok_reason, f"{len(gang)} pod(s) of the current gang", now
            )
    waiting = [(p, since) for p in gang if (since := parse_time(p.get("sandboxWaitingSince"))) is not None]
    stuck = [(p, since) for p, since in waiting if (now - since).total_seconds() >= VOLUME_ATTACH_WAIT]
    if stuck:
        name = stuck[0][0]["name"]
        minutes = int((now - stuck[0][1]).total_seconds() // 60)
        message = (
            f"pod {name} was scheduled {minutes} min ago but its volumes are not attached or mounted "
            f"(Multi-Attach, FailedAttachVolume or FailedMount: kubectl describe pod {name})"
        )
        set_condition(run_status["conditions"], "VolumeReady", False, "VolumeNotAttached", message, now)
        if "reason" not in run_status:
            run_status["reason"], run_status["message"] = "VolumeNotAttached", message


def no_pods(run_status: dict[str, Any], reason: str, message: str, now: dt.datetime) -> None:
    """No gang runs (suspended or terminal): the pod conditions go, the running ones say why they are False."""
    run_status["conditions"] = [
        c for c in run_status["conditions"] if c["type"] not in ("PodsSchedulable", "PodsHealthy")
    ]
    for c in list(run_status["conditions"]):
        if c["type"] in ("TrainerRunning", "GeneratorsReady"):
            set_condition(run_status["conditions"], c["type"], False, reason, message, now)


def volume_condition(run_status: dict[str, Any], claim: dict[str, Any], now: dt.datetime) -> None:
    """VolumeReady from the claim's phase (scheduling conflicts of the volume show in PodsSchedulable)."""
    phase = claim.get("phase")
    if phase in (None, "Bound"):
        if phase == "Bound" or any(c["type"] == "VolumeReady" for c in run_status["conditions"]):
            set_condition(
                run_status["conditions"], "VolumeReady", True, "Bound", f"claim {claim['name']} is bound", now
            )
        return
    why = {
        "Pending": "not bound yet (a WaitForFirstConsumer class binds when the first pod is scheduled; "
        "otherwise check storage.storageClassName and the provisioner)",
        "Lost": "lost its volume: the data is gone from the cluster's view",
    }.get(phase, phase)
    set_condition(
        run_status["conditions"], "VolumeReady", False, f"Claim{phase}", f"claim {claim['name']} is {phase}: {why}", now
    )
