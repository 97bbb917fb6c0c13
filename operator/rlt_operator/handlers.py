"""Kopf handlers: thin. The logic is in builders/ (manifests) and status.py (decisions).

Shape: watch-fed indices hold a summary of every child (so a reconcile makes no reads); one
daemon per RLTRun runs a serial, level-based reconcile loop, woken by any event on the run or its
children and at least every RLT_RESYNC_SECONDS; a delete handler removes the children.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import kopf
from prometheus_client import CollectorRegistry, start_http_server

from rlt.contract import metrics as catalogue
from rlt.contract.api import Phase
from rlt.contract.layout import parse_time
from rlt.contract.metrics import OPERATOR_METRICS, build
from rlt_operator.observed import Observed, failed_create, pods_not_created, summarize

from . import builders, dry_run, peering, progress, status
from .conditions import with_write_problems
from .events import COMPONENT, Recorder
from .kinds import CHILDREN, CLUSTER_PEERING, PEERING, RUN
from .kube import Kube, KubeError
from .settings import OperatorSettings
from .writes import ChildWrites, WriteProblem, conflict, owns_object, owns_pod, owns_summary, rejected

log = logging.getLogger("rlt.operator")

FINALIZER = f"{builders.PREFIX}/finalizer"


class OperatorMetrics:
    """The operator's Prometheus series (names from rlt.contract.metrics.OPERATOR_METRICS)."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self.m = build(OPERATOR_METRICS, registry)
        self._info: dict[tuple[str, str], tuple[str, str]] = {}
        self._conditions: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
        self._reconciled: set[tuple[str, str]] = set()
        # (stage, step, since when the trainer runs) last seen per run
        self._progress: dict[tuple[str, str], tuple[str, int, str | None]] = {}

    def reconciled(self, result: str, seconds: float) -> None:
        self.m[catalogue.RECONCILES].labels(result=result).inc()
        self.m[catalogue.RECONCILE_SECONDS].observe(seconds)

    def run(self, namespace: str, name: str, run_status: dict[str, Any], method: str) -> None:
        for phase in Phase:
            self.m[catalogue.RUN_PHASE].labels(namespace, name, phase).set(1 if run_status.get("phase") == phase else 0)
        info = (method, run_status.get("stage") or "none")
        old = self._info.get((namespace, name))
        if old and old != info:
            self.m[catalogue.RUN_INFO].remove(namespace, name, *old)
        self._info[(namespace, name)] = info
        self.m[catalogue.RUN_INFO].labels(namespace, name, *info).set(1)
        self.m[catalogue.RUN_RESTARTS].labels(namespace, name).set(run_status.get("restarts", 0))
        step = (run_status.get("progress") or {}).get("step", 0)
        self.m[catalogue.RUN_STEP].labels(namespace, name).set(step)
        self._stall_clock(namespace, name, run_status, int(step or 0))
        # One series per condition type: a changed status or reason replaces it (bounded: types x runs).
        had = self._conditions.setdefault((namespace, name), {})
        for c in run_status.get("conditions") or []:
            now = (c.get("status") or "Unknown", c.get("reason") or "")
            old = had.get(c["type"])
            if old and old != now:
                _remove(self.m[catalogue.RUN_CONDITION], namespace, name, c["type"], *old)
            had[c["type"]] = now
            self.m[catalogue.RUN_CONDITION].labels(namespace, name, c["type"], *now).set(1)

    def _stall_clock(self, namespace: str, name: str, run_status: dict[str, Any], step: int) -> None:
        """RLTRunStalled's clock: when the stage or step last changed, never before the trainer last started running
        (a trainer that waited an hour for its pods has not stalled); from the status's times, so a restarted
        operator does not restart it."""
        trainer = next(
            (
                c
                for c in run_status.get("conditions") or []
                if c.get("type") == "TrainerRunning" and c.get("status") == "True"
            ),
            None,
        )
        since = (trainer or {}).get("lastTransitionTime")
        now = (run_status.get("stage") or "", step, since)
        if self._progress.get((namespace, name)) == now:
            return
        self._progress[(namespace, name)] = now  # progress, a trainer started (or first seen): the clock moves
        times = [
            t.timestamp()
            for t in (parse_time((run_status.get("progress") or {}).get("stepTime")), parse_time(since))
            if t
        ]
        self.m[catalogue.RUN_STEP_TIME].labels(namespace, name).set(max(times) if times else time.time())

    def reconciled_run(self, namespace: str, name: str, ok: bool, at: float) -> None:
        """The run's last successful reconcile; a run that never had one reads 0 (no status: alert)."""
        gauge = self.m[catalogue.RUN_LAST_RECONCILE].labels(namespace, name)
        if ok:
            gauge.set(at)
        elif (namespace, name) not in self._reconciled:
            gauge.set(0)
        if ok:
            self._reconciled.add((namespace, name))

    def active(self, working: bool) -> None:
        self.m[catalogue.OPERATOR_ACTIVE].set(1 if working else 0)

    def forget(self, namespace: str, name: str) -> None:
        for phase in Phase:
            _remove(self.m[catalogue.RUN_PHASE], namespace, name, phase)
        old = self._info.pop((namespace, name), None)
        if old:
            _remove(self.m[catalogue.RUN_INFO], namespace, name, *old)
        _remove(self.m[catalogue.RUN_RESTARTS], namespace, name)
        _remove(self.m[catalogue.RUN_STEP], namespace, name)
        _remove(self.m[catalogue.RUN_STEP_TIME], namespace, name)
        self._progress.pop((namespace, name), None)
        for type_, labels in self._conditions.pop((namespace, name), {}).items():
            _remove(self.m[catalogue.RUN_CONDITION], namespace, name, type_, *labels)
        _remove(self.m[catalogue.RUN_LAST_RECONCILE], namespace, name)
        self._reconciled.discard((namespace, name))


def _remove(metric: Any, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never set for this run
        metric.remove(*labels)


@dataclass(frozen=True)
class PeeringInfo:
    """What `rlt operator --peering` passes in the root memo: the object and this replica's record in it."""

    name: str
    identity: str
    priority: int
    namespaces: tuple[str, ...] | None  # None: cluster-wide (a ClusterKopfPeering)
    lifetime: int  # seconds a keep-alive record is valid
    interval: float  # seconds between two checks


@dataclass
class OperatorState:
    """Shared by all handlers of one operator process (kept in Kopf's root memo)."""

    kube: Kube
    metrics: OperatorMetrics
    settings: OperatorSettings
    wakers: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    metrics_server: Any = None
    peering_task: asyncio.Task | None = None
    recorder: Recorder | None = None  # the runs' Events (rlt_operator.events)
    # Scopes ("" = every namespace) where this install gives way to an older rlt install (watch_peering): its
    # replicas reconcile no run there. Until the first check, every scope (the check takes one list call).
    yielded: dict[str, str] = field(default_factory=dict)

    def gives_way(self, namespace: str) -> str | None:
        """Why this install does not reconcile runs in `namespace` (another install works there), or None."""
        return self.yielded.get("") or self.yielded.get(namespace)

    def waker(self, namespace: str, name: str) -> asyncio.Event:
        return self.wakers.setdefault((namespace, name), asyncio.Event())

    def wake(self, namespace: str | None, name: str | None) -> None:
        ev = self.wakers.get((namespace or "", name or ""))
        if ev is not None:
            ev.set()


# --------------------------------------------------------------------------- startup / health


def _is(group: str, plural: str) -> Any:
    return lambda res: res.group == group and res.plural == plural


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    # Read once at start-up: `rlt operator` and the in-process operator pass theirs in the root memo.
    config: OperatorSettings = getattr(memo, "settings", None) or OperatorSettings.from_env()
    # Own finalizer and annotation prefix: never collide with another Kopf operator on the same objects.
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=builders.PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=builders.PREFIX, key="last-handled-configuration"
    )
    # Watches behind load balancers die silently: end them server-side and reconnect.
    settings.watching.server_timeout = int(config.watch_server_timeout)
    settings.watching.client_timeout = settings.watching.server_timeout + 30
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    # Children are watched server-side filtered: the API server sends only objects with the run label, so
    # memory and watch traffic grow with the runs, not with everything else in the namespaces.
    for child in CHILDREN:
        settings.watching.label_selectors[_is(child.group, child.plural)] = builders.L_RUN
    settings.posting.level = logging.WARNING  # our own Events are explicit; Kopf posts only its errors
    settings.posting.reporting_component = COMPONENT  # those, too, say From rlt-operator
    instance = config.pod_id or COMPONENT  # this replica (POD_ID, the chart sets it)
    settings.posting.reporting_instance = instance
    # Peering (standalone, or several replicas with one working) is chosen by the caller: `rlt operator --peering`.

    registry = CollectorRegistry()
    kube = Kube.from_environment()
    state = OperatorState(
        kube=kube, metrics=OperatorMetrics(registry), settings=config, recorder=Recorder(kube, instance)
    )
    info: PeeringInfo | None = getattr(memo, "peering", None)
    if info is None:  # standalone: this replica is the one that works
        state.metrics.active(True)
    else:
        state.metrics.active(False)  # until the peering object says so
        state.yielded[""] = "this replica has not yet checked for other rlt installs in its scope"
        state.peering_task = asyncio.create_task(watch_peering(state, info, logger), name="rlt peering watch")
    if config.metrics_port >= 0:
        server, _thread = start_http_server(config.metrics_port, addr=config.metrics_addr, registry=registry)
        state.metrics_server = server
        logger.info(f"operator metrics on :{server.server_port}/metrics")
    memo.rlt = state


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    state: OperatorState | None = getattr(memo, "rlt", None)
    if state is not None and state.peering_task is not None:
        state.peering_task.cancel()
    state: OperatorState | None = getattr(memo, "rlt", None)
    if state is not None and state.metrics_server is not None:
        state.metrics_server.shutdown()
        state.metrics_server.server_close()


def _iso_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


async def watch_peering(state: OperatorState, info: PeeringInfo, logger: Any) -> None:
    """Whether this replica works (rlt_operator_active, and one log line at each change: a standby says it is one),
    and whether the peering object is still there. Kopf says neither: with the object deleted the working replica
    goes on silently, and when it dies no standby takes over. A missing object is said loudly and recreated."""
    kind = CLUSTER_PEERING if info.namespaces is None else PEERING
    where = [""] if info.namespaces is None else list(info.namespaces)
    was: bool | None = None
    missing: set[str] = set()
    seen: dict[str, Any] = {}  # object -> its records; only one seen is recreated (a mistyped --peering makes none)
    labels: dict[str, Any] = {}  # object -> its labels (kept when it is recreated)
    told: set[str] = set()  # overlapping installs already reported
    while True:
        works = True
        yielded = {k: v for k, v in state.yielded.items() if k in where}  # a namespaced scope drops the start guard
        for ns in where:
            what = f"{kind.kind}/{info.name}" + (f" in namespace {ns}" if ns else "")
            try:
                found = await asyncio.to_thread(state.kube.list, kind.plural, ns, None, f"metadata.name={info.name}")
                if not found:
                    works = was is True  # Kopf keeps this replica as it was until the object is back
                    if what not in missing:
                        logger.error(
                            f"peering object {what} is missing: a standby cannot take over when the working replica "
                            "dies, and a restarted replica stays paused"
                            + ("; recreating it" if what in seen else " (never seen: is --peering right?)")
                        )
                    missing.add(what)
                    if what in seen:  # deleted (an accident, an uninstall racing an install): put it back as it was,
                        # with the records last seen: empty, it would let a standby resume beside the working replica.
                        body = {"apiVersion": f"{kind.group}/{kind.version}", "kind": kind.kind}
                        mine = {"priority": info.priority, "lifetime": info.lifetime, "lastseen": _iso_now()}
                        restored = {"name": info.name, "labels": labels.get(what, {})}
                        meta = {"metadata": restored, "status": {**seen[what], info.identity: mine}}
                        made = await asyncio.to_thread(state.kube.create, kind.plural, ns, {**body, **meta})
                        logger.warning(
                            f"peering object {what} recreated" + ("" if made is None else " (by another replica)")
                        )
                    continue
                missing.discard(what)
                seen[what] = found[0].get("status") or {}
                labels[what] = found[0]["metadata"].get("labels") or {}
                mine, others = peering.working(found[0].get("status") or {}, info.identity, info.priority)
                works = works and mine
                older = await _say_overlaps(state, kind, ns, found[0], info, told, logger)
                _give_way(yielded, kind, ns, older, logger)
            except KubeError as err:
                logger.error(
                    f"peering object {what}: cannot read or recreate it ({err}); recreate it with helm upgrade"
                )
                works = works and bool(was)
        state.yielded = yielded
        everywhere = all(yielded.get(ns) for ns in where)  # gives way in its whole scope: does no work
        works = works and not everywhere
        if works != was:
            state.metrics.active(works)
            logger.info(
                "this replica works (active)"
                if works
                else "this replica is the standby (its install gives way to an older one)"
                if everywhere
                else "this replica is the standby (paused while another works)"
            )
            was = works
        await asyncio.sleep(info.interval)


async def _say_overlaps(
    state: OperatorState, kind: Any, ns: str, own: dict[str, Any], info: PeeringInfo, told: set, logger: Any
) -> list[str]:
    """Another rlt install working in the same scope (its own peering object, live). Said once per install, loudly;
    the cure is disjoint operator.watchNamespaces (docs/operator.md). Returns the older ones, which this install
    gives way to (peering.yields_to): of two installs, one reconciles the runs."""
    objects = await asyncio.to_thread(state.kube.list, kind.plural, ns, "=".join(peering.PART_OF))
    older = peering.yields_to(objects, own)
    for other in peering.overlapping(objects, info.name):
        where = f"{kind.kind}/{other}" + (f" in namespace {ns}" if ns else "")
        if where not in told:
            told.add(where)
            logger.error(
                f"another rlt install works in this install's scope (its peering object {where} has a live replica); "
                + (
                    "it was installed first, so this install gives way there and reconciles none of those runs"
                    if other in older
                    else "this install was installed first and keeps working; the other gives way"
                )
                + ": give each install its own namespaces (operator.watchNamespaces) and at most one cluster-wide "
                "install"
            )
    return older


def _give_way(yielded: dict[str, str], kind: Any, ns: str, older: list[str], logger: Any) -> None:
    """Record (and say, at each change) whether this install gives way in scope `ns` ("" = every namespace)."""
    where = f"namespace {ns}" if ns else "the cluster"
    had = yielded.pop(ns, None)
    if older:
        names = ", ".join(f"{kind.kind}/{o}" for o in older)
        yielded[ns] = f"an older rlt install works in {where} (peering object {names})"
        if had != yielded[ns]:
            logger.error(
                f"this install gives way in {where}: {yielded[ns]}; no run there is reconciled by this install "
                "while that one has a live replica (rlt_operator_active 0 where it gives way everywhere)"
            )
    elif had is not None and not had.startswith("this replica has not yet checked"):
        logger.warning(f"this install works again in {where}: no older rlt install has a live replica there")


@kopf.on.probe(id="runs")
def probe_runs(memo: kopf.Memo, **_: Any) -> int:
    """Liveness detail: how many runs have a reconcile loop."""
    state: OperatorState | None = getattr(memo, "rlt", None)
    return len(state.wakers) if state else 0


# --------------------------------------------------------------------------- children: indices + wake-ups


def _register_child(group: str, version: str, plural: str) -> None:
    # async: Kopf would run a sync function in its thread pool, a hop per watch event for a dict copy.
    async def index(namespace: str, labels: dict[str, str], body: Any, **_: Any) -> dict:
        return {(namespace, labels[builders.L_RUN]): summarize(plural, dict(body))}

    async def wake(namespace: str, labels: dict[str, str], memo: kopf.Memo, **_: Any) -> None:
        state: OperatorState | None = getattr(memo, "rlt", None)
        if state is not None:
            state.wake(namespace, labels.get(builders.L_RUN))

    owned = {builders.L_RUN: kopf.PRESENT}
    kopf.index(group, version, plural, id=f"rlt_{plural}", labels=owned)(index)
    kopf.on.event(group, version, plural, id=f"wake_{plural}", labels=owned)(wake)


for _child in CHILDREN:
    _register_child(_child.group, _child.version, _child.plural)


@kopf.on.event(RUN.group, RUN.version, RUN.plural, id="wake_run")
async def wake_run(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    memo.rlt.wake(namespace, name)


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


# --------------------------------------------------------------------------- the reconcile loop


async def apply(
    state: OperatorState,
    ref: builders.RunRef,
    observed: Observed,
    actions: list[status.Action],
    writes: ChildWrites,
    logger: Any,
) -> tuple[list[status.Action], list[WriteProblem]]:
    """Send the decision's writes, each only to an object of the run's (rlt_operator.writes). A write the server
    refuses (4xx other than 404/409) or that meets someone else's object is not retried at once but becomes a
    problem with back-off, and the others go on. Returns the actions sent and the problems new or changed."""
    sent: list[status.Action] = []
    news: list[WriteProblem] = []
    now = time.monotonic()

    def problem(p: WriteProblem) -> None:
        if writes.failed(p, now):
            news.append(p)

    for a in actions:
        key = (a.plural, a.name)
        if not writes.due(key, now) or (a.verb == "create" and writes.blocked(a.plural)):
            continue
        child = observed.child(a.plural, a.name) if a.verb != "create" else None
        if child is not None and not _owned(ref, a.plural, child, observed):
            problem(conflict(a.plural, a.name, None))
            continue
        try:
            if a.verb == "create":
                existing = await asyncio.to_thread(state.kube.create, a.plural, ref.namespace, a.body)
                if existing is None:
                    logger.info(f"created {a.plural}/{a.name}")
                elif existing and not owns_object(ref, a.plural, existing):
                    problem(conflict(a.plural, a.name, existing))
                    continue
            elif a.verb == "patch":
                try:
                    await asyncio.to_thread(state.kube.patch, a.plural, ref.namespace, a.name, a.body)
                except KubeError as err:
                    if err.status != 404:
                        raise
                    logger.info(f"{a.plural}/{a.name} is gone; not updated")  # the next reconcile decides again
                    continue
                logger.info(f"updated {a.plural}/{a.name}")
            elif a.verb == "delete":
                if await asyncio.to_thread(state.kube.delete, a.plural, ref.namespace, a.name, a.propagation):
                    logger.info(f"deleted {a.plural}/{a.name}")
            else:  # pragma: no cover - status.py only emits these three
                raise ValueError(f"unknown action {a.verb}")
        except KubeError as err:
            if not err.refused:
                raise
            problem(rejected(a.verb, a.plural, a.name, err.status, err.server_message))
            continue
        writes.succeeded(key)
        sent.append(a)
    return sent, news


def _owned(ref: builders.RunRef, plural: str, child: dict[str, Any], observed: Observed) -> bool:
    if plural == "pods":  # its Job's or StatefulSet's, or kept for its logs
        return owns_pod(ref, child, [*observed.jobs.values(), *observed.statefulsets.values()])
    return owns_summary(ref, plural, child)


def observed_conflicts(ref: builders.RunRef, observed: Observed) -> list[WriteProblem]:
    """Run-wide children with the run's label but not the run's (an earlier run's leftovers, a copy): never used.
    The trainer Jobs and generators of an earlier run of the same name are status.decide's (it waits for them)."""
    out = []
    for plural in ("configmaps", "persistentvolumeclaims", "services", "networkpolicies"):
        for name, child in getattr(observed, plural).items():
            if not child.get("deleting") and not owns_summary(ref, plural, child):
                out.append(conflict(plural, name, None))
    return out


# How often a run whose Job or StatefulSet lacks pods reads that controller's FailedCreate Events.
FAILED_CREATE_INTERVAL = 10.0


async def read_failed_creates(
    state: OperatorState, namespace: str, observed: Observed, mem: RunMemory, logger: Any
) -> list[tuple[str, str, str]]:
    """Why a Job or StatefulSet of the run has no pods, from its controller's FailedCreate Events (a list by
    involvedObject.uid, only while pods are missing and at most every FAILED_CREATE_INTERVAL): into mem.not_created;
    returns the Warning Events to post for new messages."""
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
    news = [("Warning", p["reason"], p["message"]) for p in found if p["message"] not in mem.reported]
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
    children: dry_run.ChildrenCheck = field(default_factory=dry_run.ChildrenCheck)  # the server's dry-run verdict

    def expected(
        self, observed: Observed, actions: list[status.Action], now: float, ttl: float = 10.0
    ) -> list[status.Action]:
        for key in [k for k, t in self.created.items() if now - t > ttl or k[1] in getattr(observed, k[0], {})]:
            del self.created[key]
        return [a for a in actions if not (a.verb == "create" and (a.plural, a.name) in self.created)]


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
    # The stage's children dry-run on the server before the first create: a refused one holds every create.
    actions, invalid = await dry_run.gate(
        state.kube, ref, spec, decision.status, generation, actions, mem.children, time.monotonic(),
        state.settings.scrapers,
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
    patch = status.status_patch(server_status, run_status, now)
    if patch:
        await asyncio.to_thread(state.kube.patch, RUN.plural, namespace, name, {"status": patch}, "status")
    mem.status = run_status
    events = status.events_for(decision, sent) + [("Warning", p.reason, p.message) for p in news] + news_created
    events += invalid
    for type_, reason, message in events:
        (logger.warning if type_ == "Warning" else logger.info)(f"{reason}: {message}")
        await post_event(state, ref, type_, reason, message, now, logger)
    method = spec.get("method", "rlt") if isinstance(spec.get("method"), str) else "rlt"
    state.metrics.run(namespace, name, run_status, method)
    requeue = _min_or_none(decision.requeue_after, mem.writes.requeue(time.monotonic()))
    if job and job.get("active", 0) > 0:  # come back for the next progress read, not only at the next resync
        return min(requeue or math.inf, state.settings.progress_interval)
    return requeue


async def post_event(
    state: OperatorState, ref: builders.RunRef, type_: str, reason: str, message: str, now: dt.datetime, logger: Any
) -> None:
    """One Event of the run (rlt_operator.events: from rlt-operator, counted, not re-posted after a restart). Events
    are auxiliary: one the API server refuses is logged, and the reconcile goes on."""
    assert state.recorder is not None, "configure() makes the recorder"
    try:
        if not await asyncio.to_thread(state.recorder.record, ref, type_, reason, message, now):
            logger.debug(f"Event {reason} was posted before this operator started; not posted again")
    except Exception as err:  # noqa: BLE001 - any failure to post: said, never fatal to the reconcile
        logger.warning(f"could not post Event {reason}: {err}")


def _min_or_none(*values: float | None) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


@kopf.daemon(RUN.group, RUN.version, RUN.plural, id="reconcile", cancellation_timeout=5.0)
async def reconcile_loop(
    name: str, namespace: str, body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: Any, **kwargs: Any
) -> None:
    state: OperatorState = memo.rlt
    indices = {f"rlt_{c.plural}": kwargs[f"rlt_{c.plural}"] for c in CHILDREN}
    wake = state.waker(namespace, name)
    mem = RunMemory()
    try:
        while not stopped:
            if state.gives_way(namespace):  # another install reconciles this run (watch_peering): no write from here
                await asyncio.sleep(1.0)
                continue
            wake.clear()
            t0 = time.perf_counter()
            try:
                requeue = await reconcile_once(state, body, mem, indices, logger)
                state.metrics.reconciled("success", time.perf_counter() - t0)
                state.metrics.reconciled_run(namespace, name, True, time.time())
            except KubeError as err:
                # The loop must survive API hiccups; the next pass retries from observed state.
                logger.error(f"reconcile failed, retrying in {status.SOON * 2:.0f}s: {err}")
                state.metrics.reconciled("error", time.perf_counter() - t0)
                state.metrics.reconciled_run(namespace, name, False, time.time())
                mem.status = None  # re-read what the server has
                requeue = status.SOON * 2
            except Exception:
                # A bug must not stall this run forever nor touch the others: loud, counted, retried.
                logger.exception(f"reconcile crashed, retrying in {status.SOON * 2:.0f}s")
                state.metrics.reconciled("error", time.perf_counter() - t0)
                state.metrics.reconciled_run(namespace, name, False, time.time())
                mem.status = None  # re-read what the server has
                requeue = status.SOON * 2
            resync = state.settings.resync_seconds
            timeout = resync if requeue is None else max(0.05, min(requeue, resync))
            waiters = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())]
            try:
                await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
            if not stopped:
                await asyncio.sleep(state.settings.debounce_seconds)  # coalesce bursts of child events
    finally:
        state.wakers.pop((namespace, name), None)


# --------------------------------------------------------------------------- deletion


@kopf.on.delete(RUN.group, RUN.version, RUN.plural, id="cleanup")
async def cleanup(
    name: str, namespace: str, spec: kopf.Spec, meta: kopf.Meta, memo: kopf.Memo, logger: Any, **_: Any
) -> None:
    """Delete every child now (owner references would let a cluster's GC do it later; kmock has none)."""
    state: OperatorState = memo.rlt
    while state.gives_way(namespace):  # the other install deletes the children (and the run then goes): wait, write
        # nothing (a retry would write Kopf's progress annotation, which both installs read)
        found = await asyncio.to_thread(state.kube.list, RUN.plural, namespace, None, f"metadata.name={name}")
        if not found or found[0]["metadata"].get("uid") != meta["uid"]:
            return
        await asyncio.sleep(1.0)
    storage = spec.get("storage") or {}  # raw spec: it may be invalid
    retention = "Delete" if storage.get("retentionPolicy") == "Delete" else "Retain"  # unknown → keep the data
    ref = builders.RunRef(name=name, namespace=namespace, uid=meta["uid"])
    # Only the run's own objects, found by its label and checked by owner UID: never someone else's object that
    # happens to have a child's name, nor an object the user deleting the run has no rights to.
    for child in CHILDREN:  # pods: only a failed pod kept for its logs is the run's (the others are their Job's)
        found = await asyncio.to_thread(state.kube.list, child.plural, namespace, f"{builders.L_RUN}={name}")
        for obj in found:
            m = obj["metadata"]
            if not owns_object(ref, child.plural, obj):
                continue
            if child.plural == "persistentvolumeclaims" and (retention == "Retain" or storage.get("existingClaim")):
                continue
            await asyncio.to_thread(state.kube.delete, child.plural, namespace, m["name"], "Background", m.get("uid"))
    state.metrics.forget(namespace, name)
    if state.recorder is not None:
        state.recorder.forget(ref)
    logger.info(
        "children deleted"
        + (
            f"; volume {builders.own_claim_name(name)} retained (storage.retentionPolicy: Retain)"
            if retention == "Retain" and not storage.get("existingClaim")
            else ""
        )
    )
