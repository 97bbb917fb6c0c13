"""One pass of a run's reconcile loop: observe (from the watch-fed indices), read progress, decide (status/decide.py),
send the writes (apply/send.py), write the status, post the Events, export the run's series."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
from dataclasses import dataclass, field
from typing import Any

from rlt.contract.layout import format_time
from rlt_operator import builders
from rlt_operator.apply import dry_run, evidence
from rlt_operator.apply.send import apply, observed_conflicts
from rlt_operator.apply.writes import ChildWrites, owns_summary
from rlt_operator.cluster.kube import KubeError
from rlt_operator.cluster.state import OperatorState
from rlt_operator.config.kinds import CHILDREN, RUN
from rlt_operator.status import decide as status
from rlt_operator.status import progress
from rlt_operator.status.conditions import with_write_problems
from rlt_operator.status.decision import Action
from rlt_operator.status.events import events_for
from rlt_operator.status.observed import FAILURE_SEEN, Observed, failed_create, job_failing, pods_not_created
from rlt_operator.status.patch import status_patch


def observe(namespace: str, name: str, indices: dict[str, Any]) -> Observed:
    obs = Observed()
    for child in CHILDREN:
        store = indices[f"rlt_{child.plural}"].get((namespace, name), [])
        items = [dict(v) for v in store]
        if child.plural == "pods":
            obs.pods = items
        else:
            setattr(obs, child.plural, {i["name"]: i for i in items})
    return obs


# How often a run whose Job or StatefulSet lacks pods reads that controller's FailedCreate Events.
FAILED_CREATE_INTERVAL = 10.0


async def read_failed_creates(
    state: OperatorState, namespace: str, observed: Observed, mem: RunMemory, logger: Any
) -> list[tuple[str, str, str, str | None]]:
    """Why a Job or StatefulSet of the run has no pods, from its controller's FailedCreate Events (a list by
    involvedObject.uid, only while pods are missing and at most every FAILED_CREATE_INTERVAL): into mem.not_created;
    returns the Warning Events to post for new messages, keyed by the Job or StatefulSet (one Event each, counted:
    every retry of the controller names a new pod)."""
    needy = pods_not_created(observed)
    if not needy:
        mem.not_created, mem.reported = [], set()
        return []
    if time.monotonic() - mem.not_created_at < FAILED_CREATE_INTERVAL:
        return []
    mem.not_created_at = time.monotonic()
    found = []
    for kind, child, uid in needy:
        selector = f"involvedObject.uid={uid},reason=FailedCreate"
        try:
            events = await asyncio.to_thread(state.kube.list, "events", namespace, None, selector)
        except KubeError as err:  # informative only: never hold the reconcile up
            logger.debug(f"events of {kind} {child} not readable: {err}")
            continue
        problem = failed_create(kind, child, events)
        if problem:
            found.append(problem)
    mem.not_created = found
    news: list[tuple[str, str, str, str | None]] = [
        ("Warning", p["reason"], p["message"], p["about"]) for p in found if p["message"] not in mem.reported
    ]
    mem.reported |= {p["message"] for p in found}
    return news


@dataclass
class RunMemory:
    """What one run's loop remembers between iterations (lost on operator restart, by design)."""

    status: dict[str, Any] | None = None  # the last status we wrote (the watch may lag behind it)
    progress: dict[str, Any] | None = None
    progress_at: float = 0.0
    # Expectations (as Kubernetes controllers keep them): children we created that the watch-fed
    # index has not shown yet. Not re-posting them saves a 409 per child per reconcile.
    created: dict[tuple[str, str], float] = field(default_factory=dict)
    writes: ChildWrites = field(default_factory=ChildWrites)  # refused writes and their back-off
    not_created: list[dict[str, Any]] = field(default_factory=list)  # FailedCreate of the run's Jobs/StatefulSets
    not_created_at: float = -math.inf
    reported: set[str] = field(default_factory=set)  # FailedCreate messages already posted as Events
    generation: int = 0  # a new spec retries refused writes at once
    evidence: str | None = None  # the failed pod whose end is copied (rlt_operator.apply.evidence)
    children: dry_run.ChildrenCheck = field(default_factory=dry_run.ChildrenCheck)  # the server's dry-run verdict
    failures_seen: dict[str, dt.datetime] = field(default_factory=dict)  # failing Job uid -> first seen, our clock

    def expected(self, observed: Observed, actions: list[Action], now: float, ttl: float = 10.0) -> list[Action]:
        for key in [k for k, t in self.created.items() if now - t > ttl or k[1] in getattr(observed, k[0], {})]:
            del self.created[key]
        return [a for a in actions if not (a.verb == "create" and (a.plural, a.name) in self.created)]

    def stamp_failures(self, observed: Observed, now: dt.datetime) -> None:
        """Mark each failing Job's summary with when this loop first saw it failing (FAILURE_SEEN): the wait for its
        failed pod (status.gang.pods_behind_job) is then timed by the operator's clock alone, whatever the API
        server's clock says. Forgotten once the Job is gone or no longer failing (and on operator restart)."""
        failing = {job["uid"]: job for job in observed.jobs.values() if job.get("uid") and job_failing(job)}
        self.failures_seen = {uid: self.failures_seen.get(uid, now) for uid in failing}
        for uid, job in failing.items():
            job[FAILURE_SEEN] = format_time(self.failures_seen[uid])


async def reconcile_once(
    state: OperatorState, body: Any, mem: RunMemory, indices: dict[str, Any], logger: Any
) -> float | None:
    meta = body.get("metadata", {})
    name, namespace = meta["name"], meta["namespace"]
    ref = builders.RunRef(name=name, namespace=namespace, uid=meta["uid"])
    server_status = dict(body.get("status") or {})
    prev = mem.status if mem.status is not None else server_status
    observed = observe(namespace, name, indices)
    now = dt.datetime.now(dt.timezone.utc)
    mem.stamp_failures(observed, now)
    spec = dict(body.get("spec") or {})

    # Progress: scrape the trainer's rank 0 at most once per interval, only while it runs.
    stage = prev.get("stage") or ""
    job = observed.jobs.get(builders.trainer_name(name, stage)) if stage else None
    fresh = None
    if job and job.get("active", 0) > 0 and time.monotonic() - mem.progress_at >= state.settings.progress_interval:
        mem.progress_at = time.monotonic()
        url = progress.url_for(state.settings.progress_url, name, namespace, stage)
        try:
            text = await asyncio.to_thread(progress.fetch, url)
            mem.progress = progress.progress(name, stage, progress.parse(text, stage), mem.progress, now)
            fresh = progress.public(mem.progress)
        except (OSError, ValueError) as err:
            # Progress is informative only: an unreachable or garbled endpoint must not hold up the reconcile.
            logger.debug(f"progress not available from {url}: {err}")

    decision = status.decide(
        ref, int(meta.get("generation") or 1), spec, prev, observed, now, fresh, state.settings.scrapers
    )
    actions = mem.expected(observed, decision.actions, time.monotonic())
    generation = int(meta.get("generation") or 1)
    if generation != mem.generation:
        mem.generation, mem.writes.next_try = generation, {}
    standing = observed_conflicts(ref, observed)
    mem.writes.forget_gone({(a.plural, a.name) for a in decision.actions} | {p.key for p in standing})
    news = [p for p in standing if mem.writes.failed(p, time.monotonic())]
    # The failed pod's end is copied to a ConfigMap that outlives the run before any of its gang is deleted.
    stamp = format_time(now)
    mem.evidence = await evidence.keep(state.kube, ref, decision.status, observed.pods, mem.evidence, stamp, logger)

    # The stage's children and their pods dry-run on the server before the first create: a refused one holds every
    # create (nothing half-made); a 409 for a child the run already has is no refusal.
    def ours(plural: str, child_name: str) -> bool:
        child = observed.child(plural, child_name)
        return (plural, child_name) in mem.created or (child is not None and owns_summary(ref, plural, child))

    actions, invalid = await dry_run.gate(
        state.kube, ref, spec, decision.status, generation, actions, mem.children, time.monotonic(),
        state.settings.scrapers, ours,
    )  # fmt: skip
    sent, refused = await apply(state, ref, observed, actions, mem.writes, logger)
    news += refused
    for a in sent:
        if a.verb == "create":
            mem.created[(a.plural, a.name)] = time.monotonic()
        elif a.verb == "delete":
            mem.created.pop((a.plural, a.name), None)
    news_created = await read_failed_creates(state, namespace, observed, mem, logger)
    run_status = with_write_problems(
        decision.status, list(mem.writes.problems.values()), now, mem.not_created, prev.get("conditions")
    )
    run_status = dry_run.with_condition(run_status, mem.children, now)
    # The status is written whatever happened to the children: a refused child is on the run, not only in a log.
    patch = status_patch(server_status, run_status, now)
    if patch:
        await asyncio.to_thread(state.kube.patch, RUN.plural, namespace, name, {"status": patch}, "status")
    mem.status = run_status
    plain = events_for(decision, sent) + [("Warning", p.reason, p.message) for p in news] + invalid
    events = [(type_, reason, message, None) for type_, reason, message in plain] + news_created
    for type_, reason, message, key in events:
        (logger.warning if type_ == "Warning" else logger.info)(f"{reason}: {message}")
        await post_event(state, ref, type_, reason, message, now, logger, key)
    method = spec.get("method", "rlt") if isinstance(spec.get("method"), str) else "rlt"
    state.metrics.run(namespace, name, run_status, method)
    held = mem.children.requeue(time.monotonic())  # a refused dry-run is checked again after its back-off
    requeue = _min_or_none(decision.requeue_after, mem.writes.requeue(time.monotonic()), held)
    if job and job.get("active", 0) > 0:  # come back for the next progress read, not only at the next resync
        return min(requeue or math.inf, state.settings.progress_interval)
    return requeue


async def post_event(
    state: OperatorState,
    ref: builders.RunRef,
    type_: str,
    reason: str,
    message: str,
    now: dt.datetime,
    logger: Any,
    key: str | None = None,
) -> None:
    """One Event of the run (rlt_operator.cluster.events: from rlt-operator, counted, not re-posted after a restart). Events
    are auxiliary: one the API server refuses is logged, and the reconcile goes on."""
    assert state.recorder is not None, "configure() makes the recorder"
    try:
        if not await asyncio.to_thread(state.recorder.record, ref, type_, reason, message, now, key):
            logger.debug(f"Event {reason} was posted before this operator started; not posted again")
    except Exception as err:  # noqa: BLE001 - any failure to post: said, never fatal to the reconcile
        logger.warning(f"could not post Event {reason}: {err}")


def _min_or_none(*values: float | None) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None
