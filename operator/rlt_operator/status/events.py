"""The run's Events, from what changed between two statuses (and the decision's own TrainerCreated)."""

from __future__ import annotations

from rlt_operator.status.conditions import kubectl
from rlt_operator.status.decision import FAILED, PENDING, RUNNING, SUCCEEDED, SUSPENDED, Action, Decision
from rlt_operator.status.model import ConditionType, Progress, RLTRunStatus

# Conditions whose turning False (or changing while False) is a Warning Event.
WARN_WHEN_FALSE = (
    ConditionType.PODS_SCHEDULABLE,
    ConditionType.PODS_HEALTHY,
    ConditionType.VOLUME_READY,
    ConditionType.STAGES_CURRENT,
)


def transition_events(
    prev: RLTRunStatus, new: RLTRunStatus, namespace: str = "", failed_container: str | None = None
) -> list[tuple[str, str, str]]:
    """Kubernetes Events for what changed between two statuses (kubectl hints in `namespace`; `failed_container`:
    the container of status.lastFailedPod that failed, which the log hint names)."""
    ev: list[tuple[str, str, str]] = []
    # A failed pod kept now (keep_failed_pod): where its log is, in the GangRestart or Failed Event. The container is
    # named: without -c kubectl reads the main container, which never started when the init container failed.
    kept = new.last_failed_pod if new.last_failed_pod != prev.last_failed_pod else None
    logs = f"; its log: {log_command(namespace, kept, failed_container)}" if kept else ""
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


def log_command(namespace: str, pod: str, container: str | None) -> str:
    """The kubectl command that prints a pod's failed container's log."""
    return f"{kubectl(namespace)} logs {pod}" + (f" -c {container}" if container else "")


def resume_point(run_status: RLTRunStatus) -> str:
    """Where a new gang of the stage resumes: the newest complete checkpoint on the run's volume, which the operator
    does not read. The trainer's last report (status.progress) can be a save older: a pod stopped by SIGTERM (suspend,
    eviction) saves once more after the last scrape, so the report is named as what it is, not as the resume point."""
    checkpoint = (run_status.progress or Progress()).last_checkpoint
    newest = "the newest complete checkpoint on the run's volume"
    return f"{newest} (the trainer last reported {checkpoint})" if checkpoint else f"{newest}, if the stage has one"


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
