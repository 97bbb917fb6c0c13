"""Pure reconcile logic: (spec, previous status, observed children, now) → new status + actions.

Level-based: every call recomputes the status from the children that exist now. The previous
status contributes only what children cannot show: the restart count, the start/completion
times, stages already finished whose Jobs were cleaned up, and terminal phases (which stick).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from rlt.run.exitcodes import FAIL_FAST, ExitCode
from rlt.run.fingerprint import describe_changes, fingerprint_of, stage_fields
from rlt.spec.loading import SpecError
from rlt.spec.run import RLTRunSpec, needs_generators
from rlt.spec.validation import validate_spec

from . import builders, status_model

PENDING, RUNNING, SUSPENDED, SUCCEEDED, FAILED = "Pending", "Running", "Suspended", "Succeeded", "Failed"
PHASES = (PENDING, RUNNING, SUSPENDED, SUCCEEDED, FAILED)
TERMINAL = (SUCCEEDED, FAILED)

# Seconds to re-check while something is expected to change soon (deletions finishing, restarts).
SOON = 2.0
# A scheduled pod whose volumes are not attached and mounted after this long is reported (VolumeNotAttached).
VOLUME_ATTACH_WAIT = 180.0


# --------------------------------------------------------------------------- observed children


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
    elif plural == "configmaps":
        out["configHash"] = (meta.get("annotations") or {}).get(builders.A_CONFIG_HASH)
    elif plural == "jobs":
        out["completions"] = spec.get("completions", 1)
        out["active"] = int(status.get("active") or 0)
        out["succeeded"] = int(status.get("succeeded") or 0)
        out["failed"] = int(status.get("failed") or 0)
        out["conditions"] = [
            {"type": c.get("type"), "status": c.get("status"), "reason": c.get("reason"), "message": c.get("message")}
            for c in status.get("conditions") or []
        ]
    elif plural == "statefulsets":
        out["replicas"] = spec.get("replicas", 1)
        out["readyReplicas"] = int(status.get("readyReplicas") or 0)
    elif plural == "pods":
        out["phase"] = status.get("phase")
        containers = (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
        out["restarts"] = sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or [])
        out["problem"] = pod_problem(status, containers)
        # Scheduled but no sandbox yet: the kubelet waits for the pod's volumes to attach and mount before it
        # creates the sandbox (image pulls come after), so a long wait here is a volume that cannot attach.
        conds = {c.get("type"): c for c in status.get("conditions") or []}
        waiting = conds.get("PodReadyToStartContainers") or {}
        if (conds.get("PodScheduled") or {}).get("status") == "True" and waiting.get("status") == "False":
            out["sandboxWaitingSince"] = waiting.get("lastTransitionTime")
        # Preemption, node drain, eviction: the pod did nothing wrong (podFailurePolicy Ignore, not counted).
        out["disrupted"] = any(
            c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        codes = [
            t.get("exitCode")
            for c in containers
            for t in ((c.get("state") or {}).get("terminated"),)
            if t and t.get("exitCode")
        ]
        out["exitCode"] = int(codes[0]) if codes else None
    return out


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


def _cond_true(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    conditions: list[dict[str, Any]] = obj.get("conditions", [])
    for c in conditions:
        if c.get("type") == type_ and c.get("status") == "True":
            return c
    return None


def job_complete(job: dict[str, Any] | None) -> bool:
    if not job or job.get("deleting"):
        return False
    return bool(_cond_true(job, "Complete")) or job.get("succeeded", 0) >= job.get("completions", 1)


def job_failure(job: dict[str, Any] | None) -> str | None:
    if not job:
        return None
    c = _cond_true(job, "Failed")
    if c:
        return f"{c.get('reason') or 'Failed'}: {c.get('message') or 'a trainer pod failed'}"
    if job.get("failed", 0) > 0:
        return f"{job['failed']} trainer pod(s) failed"
    return None


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


def decide(
    ref: builders.RunRef,
    generation: int,
    raw_spec: dict[str, Any],
    prev: dict[str, Any] | None,
    observed: Observed,
    now: dt.datetime,
    progress: dict[str, Any] | None = None,
) -> Decision:
    prev = dict(prev or {})
    run_status: dict[str, Any] = {
        "phase": prev.get("phase") or PENDING,
        "stage": prev.get("stage") or "",
        "observedGeneration": generation,
        "restarts": int(prev.get("restarts") or 0),
        "disruptions": int(prev.get("disruptions") or 0),
        "startTime": prev.get("startTime"),
        "completionTime": prev.get("completionTime"),
        "completedStages": list(prev.get("completedStages") or []),
        "stageSpecs": dict(prev.get("stageSpecs") or {}),
        "lastFailure": prev.get("lastFailure"),
        "progress": dict(prev.get("progress") or {}),
        "outputs": dict(prev.get("outputs") or {}),  # recomputed below; kept as is while the spec is invalid
        "trainerShape": dict(prev.get("trainerShape") or {}) or None,
        "conditions": [dict(c) for c in prev.get("conditions") or []],
    }
    if prev.get("reason"):
        run_status["reason"], run_status["message"] = prev.get("reason"), prev.get("message", "")
    plan = _Plan(observed)
    gen_name = builders.generator_name(ref.name)

    # A run failed as InvalidSpec by an older operator recovers too: invalid specs are not terminal now.
    if run_status["phase"] == FAILED and run_status.get("reason") == "InvalidSpec":
        run_status["phase"] = PENDING
        run_status.pop("reason", None)
        run_status.pop("message", None)
        run_status["conditions"] = [c for c in run_status["conditions"] if c["type"] != "Failed"]
    try:
        spec = validate_spec(raw_spec, name=ref.name, source=f"rltrun/{ref.name}")
    except SpecError as err:
        # The same check as `rlt validate`. Hold: nothing is started or stopped (the pods keep the last valid
        # spec in their ConfigMap); the condition says why, and fixing the spec resumes from here.
        message = "; ".join(err.problems)
        if run_status["phase"] not in TERMINAL:
            run_status.update(reason="InvalidSpec", message=message)
        set_condition(run_status["conditions"], "SpecValid", False, "InvalidSpec", message, now)
        return _finish(prev, run_status, plan, None)
    set_condition(run_status["conditions"], "SpecValid", True, "Valid", "the spec passes rlt validate", now)

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
        _volume_condition(run_status, claim, now)  # a user's existingClaim is not watched (it has no run label)

    # Stages whose Job completed (or completed before and was cleaned up) are done.
    done = [
        s
        for s in enabled
        if s in run_status["completedStages"] or job_complete(observed.jobs.get(builders.trainer_name(ref.name, s)))
    ]
    run_status["completedStages"] = done
    run_status["outputs"] = builders.outputs(ref.name, spec, done)
    finished_stage_edits(run_status, spec, done, now)

    if run_status["phase"] not in TERMINAL:
        start = parse_time(run_status["startTime"])
        deadline = spec.active_deadline_seconds
        # Completion first: a run whose last Job completed in time but is observed after the deadline
        # (operator down, slow watch) is done, not DeadlineExceeded.
        if len(done) == len(enabled):
            run_status.update(
                phase=SUCCEEDED, stage="", reason="Succeeded", message="all stages finished: " + ", ".join(enabled)
            )
            set_condition(run_status["conditions"], "Complete", True, "Succeeded", run_status["message"], now)
        elif start and deadline and (now - start).total_seconds() >= deadline and not spec.suspend:
            _fail(
                run_status,
                "DeadlineExceeded",
                f"the run was active longer than activeDeadlineSeconds ({deadline}s)",
                now,
            )
    if run_status["phase"] in TERMINAL:
        return _finish(prev, run_status, plan, _terminal(ref, spec, run_status, plan, observed, now))

    stage = next(s for s in enabled if s not in done)
    if stage != run_status["stage"]:
        run_status["progress"] = {}
        run_status.pop("trainerShape", None)
    run_status["stage"] = stage
    job_name = builders.trainer_name(ref.name, stage)
    restarts = run_status["restarts"]

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
        run_status.update(phase=SUSPENDED, startTime=None, reason="Suspended", message="spec.suspend is true")
        set_condition(run_status["conditions"], "Suspended", True, "Suspended", "all GPU pods deleted; data kept", now)
        _no_pods(run_status, "Suspended", f"stage {stage}: suspended (spec.suspend)", now)
        return _finish(prev, run_status, plan, None)
    if run_status["phase"] == SUSPENDED:
        set_condition(run_status["conditions"], "Suspended", False, "Resumed", "resuming from the last checkpoint", now)
        run_status["phase"] = PENDING
    run_status.pop("reason", None)
    run_status.pop("message", None)
    if not run_status["startTime"]:
        run_status["startTime"] = fmt_time(now)
    requeue: float | None = None
    if spec.active_deadline_seconds:
        started = parse_time(run_status["startTime"])
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
    run_spec = builders.with_trainer_shape(spec, shape["nodes"], shape["gpus"])
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
    if job is not None or done or run_status["phase"] == RUNNING:
        run_status["phase"] = RUNNING

    # A failure anywhere in the current gang restarts the whole gang (trainer and generators), except a
    # config/data error of the trainer (retrying cannot help: fail now) and a disruption (restart, uncounted).
    failure, fatal, disrupted = gang_failure(job, job_name, observed.pods, stage, restarts)
    if fatal:
        _fail(
            run_status,
            "ConfigError",
            f"{fatal}; not retried (fix the spec or the data, then create the run again)",
            now,
        )
        return _finish(prev, run_status, plan, _terminal(ref, spec, run_status, plan, observed, now))
    if failure:
        counted = restarts - int(run_status.get("disruptions") or 0)
        if disrupted or counted < spec.backoff_limit:
            run_status["restarts"] = restarts + 1
            if disrupted:
                run_status["disruptions"] = int(run_status.get("disruptions") or 0) + 1
            plan.delete("jobs", job_name, "Foreground")
            plan.delete("statefulsets", gen_name, "Foreground")
            set_condition(run_status["conditions"], "TrainerRunning", False, "GangRestart", failure, now)
            run_status["lastFailure"] = failure
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
        plan.ensure("networkpolicies", builders.generator_network_policy(ref, spec))
        plan.ensure("services", builders.generator_service(ref, spec, stage, restarts))
        if sts is None and not waiting:
            plan.ensure("statefulsets", builders.generator_statefulset(ref, spec, stage, restarts))
        want = spec.resources.generator.replicas
        have = sts["readyReplicas"] if sts else 0
        ready = sts is not None and have >= want
        set_condition(
            run_status["conditions"],
            "GeneratorsReady",
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
        else "waiting for generators"
        if not ready
        else f"{running_pods}/{want_pods} trainer pods running"
        if job
        else "trainer starting"
    )
    set_condition(
        run_status["conditions"],
        "TrainerRunning",
        active,
        "Running" if active else "Waiting",
        f"stage {stage}: {why}",
        now,
    )
    _pod_conditions(run_status, gang, now)
    if progress is not None and progress.get("stage", stage) == stage:
        run_status["progress"] = {k: v for k, v in progress.items() if k != "stage"}
        if "step" in run_status["progress"]:
            total = run_status["progress"].get("totalSteps")
            step = run_status["progress"]["step"]
            run_status["progress"]["stepOfTotal"] = f"{step}/{total}" if total else str(step)
    return _finish(prev, run_status, plan, _min(requeue, SOON if waiting else None))


def finished_stage_edits(run_status: dict[str, Any], spec: RLTRunSpec, done: list[str], now: dt.datetime) -> None:
    """Record the spec each stage finished under (status.stageSpecs) and report a later edit of it.

    A finished stage is never re-run by the operator: an edit of the fields its output depends on is not
    applied, so the condition StagesCurrent says so, naming the changed fields (docs/operator.md)."""
    records = {s: r for s, r in (run_status.get("stageSpecs") or {}).items() if s in done}
    edits = []
    for stage in done:
        fields = stage_fields(spec, stage)
        record = records.get(stage)
        if record is None:  # finished now (or before the operator recorded stage specs): this spec is its spec
            records[stage] = {
                "fingerprint": fingerprint_of(fields),
                "fields": {k: json.dumps(v) for k, v in fields.items()},
            }
        elif record["fingerprint"] != fingerprint_of(fields):
            old = {k: json.loads(v) for k, v in record["fields"].items()}
            edits.append(f"stage {stage} finished under a different spec ({describe_changes(old, fields)})")
    run_status["stageSpecs"] = records
    if edits:
        set_condition(
            run_status["conditions"],
            "StagesCurrent",
            False,
            "FinishedStageEdited",
            "; ".join(edits) + ". Not applied: a finished stage is not run again and its outputs stay "
            "those of the old spec; restore the old values, or train under the new ones in a new RLTRun",
            now,
        )
    elif records:
        set_condition(
            run_status["conditions"],
            "StagesCurrent",
            True,
            "Current",
            "finished stages ran under the current spec: " + ", ".join(records),
            now,
        )


def trainer_shape(spec: RLTRunSpec, stage: str, run_status: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    """The nodes x gpus the current stage's trainer runs with (kept in status.trainerShape)."""
    want = {"stage": stage, "nodes": spec.resources.trainer.nodes, "gpus": spec.resources.trainer.gpus}
    had = run_status.get("trainerShape") or {}
    checkpointed = bool((run_status.get("progress") or {}).get("lastCheckpoint"))
    if had.get("stage") == stage and checkpointed and (had["nodes"], had["gpus"]) != (want["nodes"], want["gpus"]):
        set_condition(
            run_status["conditions"],
            "SpecApplied",
            False,
            "ShapeFrozen",
            f"resources.trainer nodes/gpus {want['nodes']}x{want['gpus']} apply from the next stage: "
            f"stage {stage} has a checkpoint written by {had['nodes']}x{had['gpus']} (ZeRO checkpoints "
            "resume only with the world size that wrote them)",
            now,
        )
        return had
    if any(c["type"] == "SpecApplied" for c in run_status["conditions"]):
        set_condition(
            run_status["conditions"], "SpecApplied", True, "Applied", "the trainer runs the spec's shape", now
        )
    run_status["trainerShape"] = want
    return want


def gang_failure(
    job: dict[str, Any] | None, job_name: str, pods: list[dict[str, Any]], stage: str, restarts: int
) -> tuple[str | None, str | None, bool]:
    """(failure, fatal, disrupted) of the current gang: `fatal` when a trainer exited with a config/data error
    code (the Job's podFailurePolicy failed it); `disrupted` when the failure is a disruption only."""
    gang = [
        p
        for p in pods
        if p["labels"].get(builders.L_STAGE) == stage and p["labels"].get(builders.L_RESTART) == str(restarts)
    ]
    for pod in gang:
        if pod["labels"].get(builders.L_ROLE) == builders.ROLE_TRAINER and pod.get("exitCode") in FAIL_FAST:
            code = ExitCode(pod["exitCode"])
            return (None, f"trainer pod {pod['name']} exited with {code.name} ({int(code)})", False)
    reason = (_cond_true(job, "Failed") or {}).get("reason") if job else None
    if reason == "PodFailurePolicy":  # the FailJob rule matched (the pod itself may be gone)
        return None, f"trainer Job {job_name}: {job_failure(job)}", False
    failure = job_failure(job)
    if failure:
        return f"trainer Job {job_name}: {failure}", None, False
    for pod in gang:
        role = pod["labels"].get(builders.L_ROLE)
        if pod.get("phase") == "Failed":
            why = (pod.get("problem") or {}).get("reason") or (
                f"exit code {pod['exitCode']}" if pod.get("exitCode") else ""
            )
            if pod.get("disrupted"):
                return f"{role} pod {pod['name']} was disrupted (preempted, evicted or its node drained)", None, True
            return f"{role} pod {pod['name']} failed" + (f" ({why})" if why else ""), None, False
        if role == builders.ROLE_GENERATOR and pod.get("restarts", 0) > 0:
            why = (pod.get("problem") or {}).get("reason")
            return (
                f"{role} pod {pod['name']} restarted {pod['restarts']} time(s)" + (f" ({why})" if why else ""),
                None,
                False,
            )
    return None, None, False


def _pod_conditions(run_status: dict[str, Any], gang: list[dict[str, Any]], now: dt.datetime) -> None:
    """PodsSchedulable and PodsHealthy from the current gang's pods; the first problem becomes the run's reason."""
    problems = [(p["name"], p["problem"]) for p in gang if p.get("problem")]
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


def _no_pods(run_status: dict[str, Any], reason: str, message: str, now: dt.datetime) -> None:
    """No gang runs (suspended or terminal): the pod conditions go, the running ones say why they are False."""
    run_status["conditions"] = [
        c for c in run_status["conditions"] if c["type"] not in ("PodsSchedulable", "PodsHealthy")
    ]
    for c in list(run_status["conditions"]):
        if c["type"] in ("TrainerRunning", "GeneratorsReady"):
            set_condition(run_status["conditions"], c["type"], False, reason, message, now)


def _volume_condition(run_status: dict[str, Any], claim: dict[str, Any], now: dt.datetime) -> None:
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


def _foreign(child: dict[str, Any], ref: builders.RunRef) -> bool:
    """A GPU child of an earlier RLTRun with the same name (deleted and re-created): never adopt it."""
    return child.get("owner") not in (None, ref.uid)


def _fail(run_status: dict[str, Any], reason: str, message: str, now: dt.datetime) -> None:
    run_status.update(phase=FAILED, reason=reason, message=message)
    set_condition(run_status["conditions"], "Failed", True, reason, message, now)


def _terminal(
    ref: builders.RunRef,
    spec: RLTRunSpec,
    run_status: dict[str, Any],
    plan: _Plan,
    observed: Observed,
    now: dt.datetime,
) -> float | None:
    """Free the GPUs now; keep finished trainer Jobs (their logs) until ttlSecondsAfterFinished."""
    if not run_status.get("completionTime"):
        run_status["completionTime"] = fmt_time(now)
    run_status["stage"] = ""
    run_status.pop("trainerShape", None)
    plan.delete("statefulsets", builders.generator_name(ref.name))
    for stage in spec.stages.enabled():
        job = observed.jobs.get(builders.trainer_name(ref.name, stage))
        if job and job.get("active", 0) > 0:
            plan.delete("jobs", builders.trainer_name(ref.name, stage), "Foreground")
    _no_pods(run_status, "Finished", f"run {run_status['phase'].lower()}", now)
    ttl = spec.ttl_seconds_after_finished
    if ttl is None:
        return None
    finished = parse_time(run_status["completionTime"])
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


def transition_events(prev: dict[str, Any], run_status: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Kubernetes Events for what changed between two statuses."""
    ev: list[tuple[str, str, str]] = []
    p_phase, phase = prev.get("phase") or "", run_status["phase"]
    if int(run_status.get("restarts") or 0) > int(prev.get("restarts") or 0):
        uncounted = int(run_status.get("disruptions") or 0) > int(prev.get("disruptions") or 0)
        ev.append(
            (
                "Warning",
                "GangRestart",
                f"restart {run_status['restarts']}: {run_status.get('lastFailure', 'a pod failed')}; "
                "trainer and generators restart from the last checkpoint"
                + (" (a disruption: not counted against backoffLimit)" if uncounted else ""),
            )
        )
    if run_status.get("reason") == "InvalidSpec" and (prev.get("reason"), prev.get("message")) != (
        "InvalidSpec",
        run_status["message"],
    ):
        ev.append(
            (
                "Warning",
                "InvalidSpec",
                f"{run_status['message']}; nothing is started or stopped until the spec is fixed",
            )
        )
    elif prev.get("reason") == "InvalidSpec" and run_status.get("reason") != "InvalidSpec":
        ev.append(("Normal", "SpecValid", "the spec is valid again; reconciling"))
    before = {c["type"]: c for c in prev.get("conditions") or []}
    for c in run_status.get("conditions") or []:
        if c["type"] in ("PodsSchedulable", "PodsHealthy", "VolumeReady", "StagesCurrent") and c["status"] == "False":
            old = before.get(c["type"]) or {}
            if (old.get("status"), old.get("reason"), old.get("message")) != ("False", c["reason"], c["message"]):
                ev.append(("Warning", c["reason"], c["message"]))
    for stage in run_status.get("completedStages") or []:
        if stage not in (prev.get("completedStages") or []):
            ev.append(("Normal", "StageCompleted", f"stage {stage} completed"))
    if run_status.get("stage") and run_status["stage"] != (prev.get("stage") or ""):
        ev.append(("Normal", "StageStarted", f"stage {run_status['stage']} started"))
    if phase != p_phase:
        if phase == FAILED:
            ev.append(("Warning", run_status.get("reason") or "Failed", run_status.get("message") or "run failed"))
        elif phase == SUCCEEDED:
            ev.append(("Normal", "Succeeded", run_status.get("message") or "run succeeded"))
        elif phase == SUSPENDED:
            ev.append(("Normal", "Suspended", "GPU pods deleted; data kept"))
        elif p_phase == SUSPENDED:
            ev.append(("Normal", "Resumed", "resuming from the last checkpoint"))
        elif phase == RUNNING:
            ev.append(("Normal", "Running", f"the run is running (stage {run_status.get('stage')})"))
    return ev


def events_for(decision: Decision, applied: list[Action]) -> list[tuple[str, str, str]]:
    """The decision's Events, without TrainerCreated for a create that was not sent (already in flight)."""
    sent = {a.name for a in applied if a.verb == "create" and a.plural == "jobs"}
    return [e for e in decision.events if e[1] != "TrainerCreated" or any(f"Job {n} created" in e[2] for n in sent)]


def _finish(prev: dict[str, Any], run_status: dict[str, Any], plan: _Plan, requeue: float | None) -> Decision:
    if run_status.get("startTime") is None:
        run_status.pop("startTime", None)
    if run_status.get("completionTime") is None:
        run_status.pop("completionTime", None)
    if not run_status.get("trainerShape"):
        run_status.pop("trainerShape", None)
    if not run_status.get("lastFailure"):
        run_status.pop("lastFailure", None)
    if not run_status.get("stageSpecs"):
        run_status.pop("stageSpecs", None)
    status_model.check(run_status)  # a field the CRD does not list would be pruned by the API server
    events = transition_events(prev, run_status)
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
    return Decision(status=run_status, actions=plan.actions, events=events, requeue_after=requeue)


OWN_STATUS_FIELDS = (
    "phase",
    "stage",
    "reason",
    "message",
    "observedGeneration",
    "restarts",
    "disruptions",
    "trainerShape",
    "lastFailure",
    "startTime",
    "completionTime",
    "completedStages",
    "stageSpecs",
    "progress",
    "outputs",
    "conditions",
)


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
