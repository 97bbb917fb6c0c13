"""The run's status conditions: timestamps, upserting one condition, and the pod and volume conditions."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from rlt.contract.api import Phase
from rlt.contract.layout import format_time, parse_time
from rlt_operator.status import model as status_model
from rlt_operator.status.model import Condition, ConditionType, RLTRunStatus

# A scheduled pod whose volumes are not attached and mounted after this long is reported (VolumeNotAttached).
VOLUME_ATTACH_WAIT = 180.0
VOLUME_NOT_ATTACHED = "VolumeNotAttached"  # VolumeReady's reason while a scheduled pod waits for its volumes
# A deleted pod still there this long after its deletionTimestamp (= deletion + grace period) is stuck Terminating.
STUCK_TERMINATING_AFTER = 120.0
# ReadWriteOnce runs: a trainer pod unschedulable this long beside its generators releases the gang (status/gang.py).
RWO_PLACEMENT_SECONDS = 600.0


def set_condition(
    conds: list[Condition], type_: ConditionType, status: bool | None, reason: str, message: str, now: dt.datetime
) -> None:
    """Upsert a condition (status None: Unknown); lastTransitionTime changes only when its status does."""
    value: Literal["True", "False", "Unknown"] = "Unknown" if status is None else "True" if status else "False"
    for c in conds:
        if c.type == type_:
            if c.status != value:
                c.last_transition_time = format_time(now)
            c.status, c.reason, c.message = value, reason, message
            return
    conds.append(
        Condition(type=type_, status=value, reason=reason, message=message, last_transition_time=format_time(now))
    )


def has_condition(run_status: RLTRunStatus, type_: ConditionType) -> bool:
    return any(c.type == type_ for c in run_status.conditions or [])


# The reason of a run one of whose finished stages was edited (StagesCurrent=False): a note, which a problem replaces.
STAGE_EDITED = "FinishedStageEdited"
# TrainerRunning's reason while a failed Job's pod is awaited before the restart (status.gang.pods_behind_job).
WAITING_FOR_FAILED_POD = "WaitingForFailedPod"
# TrainerRunning's reasons while a failed gang is replaced: the run does not progress then (Ready=False).
RESTARTING = ("GangRestart", "RestartBackOff", WAITING_FOR_FAILED_POD)


def hold(run_status: RLTRunStatus, reason: str, message: str) -> None:
    """Make `reason` the run's reason unless an earlier problem already is."""
    if run_status.reason is None or (run_status.reason == STAGE_EDITED and reason != STAGE_EDITED):
        run_status.reason, run_status.message = reason, message


def _find(run_status: RLTRunStatus, type_: ConditionType) -> Condition | None:
    return next((c for c in run_status.conditions or [] if c.type == type_), None)


def stage_edit_reason(run_status: RLTRunStatus) -> None:
    """An edit of a finished stage (StagesCurrent=False) shows in the REASON column of `kubectl get rlt`: the reason of
    a run nothing else holds, and of a Succeeded run (which says Succeeded again once the edit is undone)."""
    edited = _find(run_status, ConditionType.STAGES_CURRENT)
    edited = edited if edited is not None and edited.status == "False" else None
    if run_status.phase == Phase.SUCCEEDED:
        if edited is not None:
            run_status.reason, run_status.message = edited.reason, edited.message
        elif run_status.reason == STAGE_EDITED:
            complete = _find(run_status, ConditionType.COMPLETE)
            run_status.reason, run_status.message = "Succeeded", complete.message if complete else "run succeeded"
    elif edited is not None and run_status.phase != Phase.FAILED:
        hold(run_status, edited.reason or STAGE_EDITED, edited.message or "")


def ready_condition(run_status: RLTRunStatus, now: dt.datetime) -> None:
    """Ready, the standard condition (`kubectl wait --for=condition=Ready`, Argo CD and Flux health): True while the
    run progresses (Running, nothing holds it, no gang being replaced) or has succeeded; False otherwise, with the
    reason (Pending's wait, the problem that holds it, Suspended, the failure)."""
    conds = run_status.conditions = run_status.conditions or []
    trainer = _find(run_status, ConditionType.TRAINER_RUNNING)
    waiting = trainer if trainer is not None and trainer.status == "False" else None
    phase, held = run_status.phase, run_status.reason not in (None, STAGE_EDITED)
    if phase == Phase.SUCCEEDED:
        complete = _find(run_status, ConditionType.COMPLETE)
        set_condition(conds, ConditionType.READY, True, "Succeeded", (complete and complete.message) or "", now)
    elif phase == Phase.RUNNING and not held and not (waiting and waiting.reason in RESTARTING):
        message = (trainer and trainer.message) or "the run's pods run"
        set_condition(conds, ConditionType.READY, True, "Training" if waiting is None else "Progressing", message, now)
    elif held:
        set_condition(conds, ConditionType.READY, False, run_status.reason or "", run_status.message or "", now)
    elif waiting is not None:
        set_condition(conds, ConditionType.READY, False, waiting.reason or str(phase), waiting.message or "", now)
    else:
        set_condition(conds, ConditionType.READY, False, str(phase or Phase.PENDING), f"phase {phase}", now)


def stuck_terminating(pods: list[dict[str, Any]], now: dt.datetime, namespace: str = "") -> dict[str, Any] | None:
    """A problem (as pod_problem gives) for the first pod stuck Terminating: on a NotReady node (after a GPU Xid
    error, a kernel hang) the kubelet never confirms the deletion, and a gang restart waits for the old pods."""
    for p in pods:
        at = parse_time(p.get("deletionTimestamp")) if p.get("deleting") else None
        if at is not None and (now - at).total_seconds() >= STUCK_TERMINATING_AFTER:
            return {
                "kind": "Container",
                "reason": "PodStuckTerminating",
                "message": f"stuck Terminating since {format_time(at)} on node {p.get('node') or '?'} (probably "
                "NotReady): the gang restart waits until it is gone. If the node is lost and its processes are "
                f"surely stopped, remove it: {kubectl(namespace)} delete pod {p['name']} --grace-period=0 --force",
                "pod": p["name"],
            }
    return None


def kubectl(namespace: str) -> str:
    """The kubectl prefix of a hint: on-call's context is seldom the run's namespace."""
    return f"kubectl -n {namespace}" if namespace else "kubectl"


def pod_conditions(
    run_status: RLTRunStatus,
    gang: list[dict[str, Any]],
    now: dt.datetime,
    blocked: dict[str, Any] | None = None,
    namespace: str = "",
) -> None:
    """PodsSchedulable and PodsHealthy from the current gang's pods; the first problem becomes the run's reason.
    `blocked`: a pod of an older gang that the restart waits for (stuck_terminating), reported first."""
    conds = run_status.conditions = run_status.conditions or []
    problems = [(p["name"], p["problem"]) for p in gang if p.get("problem")]
    unscheduled = None  # a pod with no node and no scheduler's answer: the REASON unless a pod has a real problem
    if blocked:
        problems.insert(0, (blocked["pod"], blocked))
    for cond, kind, ok_reason in (
        (ConditionType.PODS_SCHEDULABLE, "Unschedulable", "Scheduled"),
        (ConditionType.PODS_HEALTHY, "Container", "Healthy"),
    ):
        mine = [(name, pr) for name, pr in problems if pr["kind"] == kind]
        if mine:
            name, pr = mine[0]
            more = f" (and {len(mine) - 1} more pod(s))" if len(mine) > 1 else ""
            set_condition(conds, cond, False, pr["reason"], f"pod {name}: {pr['message']}{more}", now)
            hold(run_status, pr["reason"], f"pod {name}: {pr['message']}{more}")
        elif cond == ConditionType.PODS_SCHEDULABLE and (unplaced := [p for p in gang if not p.get("scheduled")]):
            # No node yet and no scheduler's answer: not known to be schedulable (a scheduler that is not running
            # never says Unschedulable).
            by = unplaced[0].get("schedulerName")
            message = f"pod {unplaced[0]['name']} has no node yet" + (
                f" (schedulerName {by}: is that scheduler running?)" if by else ""
            )
            more = f" (and {len(unplaced) - 1} more pod(s))" if len(unplaced) > 1 else ""
            set_condition(conds, cond, None, "NotScheduled", message + more, now)
            unscheduled = message + more
        elif gang or has_condition(run_status, cond):
            set_condition(conds, cond, True, ok_reason, f"{len(gang)} pod(s) of the current gang", now)
    if unscheduled:
        hold(run_status, "NotScheduled", unscheduled)  # the REASON column is not empty while pods wait for a node
    waiting = [(p, since) for p in gang if (since := parse_time(p.get("sandboxWaitingSince"))) is not None]
    stuck = [(p, since) for p, since in waiting if (now - since).total_seconds() >= VOLUME_ATTACH_WAIT]
    if stuck:
        name = stuck[0][0]["name"]
        # A fixed time, not "N min ago": the message (and so its Warning Event) stays the same while it lasts.
        message = (
            f"pod {name} has waited for its volumes since {format_time(stuck[0][1])}: not attached or mounted "
            f"(Multi-Attach, FailedAttachVolume or FailedMount: {kubectl(namespace)} describe pod {name})"
        )
        set_condition(conds, ConditionType.VOLUME_READY, False, VOLUME_NOT_ATTACHED, message, now)
        hold(run_status, VOLUME_NOT_ATTACHED, message)
    elif volume_not_attached(run_status):
        set_condition(conds, ConditionType.VOLUME_READY, True, "Bound", "no pod of the gang waits for its volumes", now)


def volume_not_attached(run_status: RLTRunStatus) -> bool:
    """VolumeReady is False because a pod waits for its volumes (pod_conditions), not because of the claim."""
    return any(
        c.type == ConditionType.VOLUME_READY and (c.status, c.reason) == ("False", VOLUME_NOT_ATTACHED)
        for c in run_status.conditions or []
    )


def no_pods(run_status: RLTRunStatus, reason: str, message: str, now: dt.datetime) -> None:
    """No gang runs (suspended or terminal): the pod conditions go, the running ones say why they are False."""
    gone = (ConditionType.PODS_SCHEDULABLE, ConditionType.PODS_HEALTHY)
    was_waiting = volume_not_attached(run_status)
    conds = run_status.conditions = [c for c in run_status.conditions or [] if c.type not in gone]
    if was_waiting:
        set_condition(
            conds, ConditionType.VOLUME_READY, True, "Bound", f"no pod waits for its volumes ({message})", now
        )
    for c in list(conds):
        if c.type in (ConditionType.TRAINER_RUNNING, ConditionType.GENERATORS_READY):
            set_condition(conds, c.type, False, reason, message, now)


def volume_condition(run_status: RLTRunStatus, claim: dict[str, Any], now: dt.datetime) -> None:
    """VolumeReady from the claim's phase (scheduling conflicts of the volume show in PodsSchedulable)."""
    conds = run_status.conditions = run_status.conditions or []
    phase = claim.get("phase")
    if phase in (None, "Bound"):
        if volume_not_attached(run_status):
            return  # bound, but a pod still waits for it: the gang's pods decide (pod_conditions), or its status flaps
        if phase == "Bound" or has_condition(run_status, ConditionType.VOLUME_READY):
            set_condition(conds, ConditionType.VOLUME_READY, True, "Bound", f"claim {claim['name']} is bound", now)
        return
    why = {
        "Pending": "not bound yet (a WaitForFirstConsumer class binds when the first pod is scheduled; "
        "otherwise check storage.storageClassName and the provisioner)",
        "Lost": "lost its volume: the data is gone from the cluster's view",
    }.get(phase, phase)
    message = f"claim {claim['name']} is {phase}: {why}"
    set_condition(conds, ConditionType.VOLUME_READY, False, f"Claim{phase}", message, now)


def child_writes(run_status: RLTRunStatus, problems: list[Any], now: dt.datetime) -> None:
    """ChildrenWritten from the child writes the API server refused or that met someone else's object
    (writes.WriteProblem): False with the first problem's reason and the server's message, which becomes the run's
    reason; True again once every write went through."""
    conds = run_status.conditions = run_status.conditions or []
    if problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        set_condition(conds, ConditionType.CHILDREN_WRITTEN, False, first.reason, first.message + more, now)
        hold(run_status, first.reason, first.message + more)
    elif has_condition(run_status, ConditionType.CHILDREN_WRITTEN):
        set_condition(conds, ConditionType.CHILDREN_WRITTEN, True, "Written", "every child was written", now)


def pods_not_created(run_status: RLTRunStatus, problems: list[dict[str, Any]], now: dt.datetime) -> None:
    """PodsSchedulable=False with the Job's or StatefulSet's FailedCreate message (observed.failed_create) when its
    controller cannot create the pods; the run's reason while it lasts."""
    if problems:
        first = problems[0]
        conds = run_status.conditions = run_status.conditions or []
        set_condition(conds, ConditionType.PODS_SCHEDULABLE, False, first["reason"], first["message"], now)
        hold(run_status, first["reason"], first["message"])


def with_write_problems(
    run_status: dict[str, Any],
    problems: list[Any],
    now: dt.datetime,
    not_created: list[dict[str, Any]] | None = None,
    prev_conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The decided status (as status.decide returns it) plus ChildrenWritten from the refused child writes and
    PodsSchedulable from the controllers' FailedCreate Events."""
    typed = RLTRunStatus.model_validate(run_status)
    if not problems and not not_created and not has_condition(typed, ConditionType.CHILDREN_WRITTEN):
        return run_status
    child_writes(typed, problems, now)
    pods_not_created(typed, not_created or [], now)
    ready_condition(typed, now)
    # decide() set these conditions from the pods before: keep the transition time of one whose status is unchanged
    before = {c["type"]: c for c in prev_conditions or []}
    for c in typed.conditions or []:
        old = before.get(c.type)
        if old and old.get("status") == c.status and old.get("lastTransitionTime"):
            c.last_transition_time = old["lastTransitionTime"]
    out = typed.model_dump(mode="json", by_alias=True, exclude_none=True)
    status_model.check(out)
    return out
