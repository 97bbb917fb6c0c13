"""Kopf handlers: thin. Each says when something happens; the work is elsewhere: builders/ (manifests),
status/decide.py (decisions), reconcile.py (one pass of a run's loop), apply/send.py (the child writes),
cluster/peering_watch.py (which replica and install works), cluster/operator_metrics.py (the operator's series).

Shape: watch-fed indices hold a summary of every child (so a reconcile makes no reads); one
daemon per RLTRun runs a serial, level-based reconcile loop, woken by any event on the run or its
children and at least every RLT_RESYNC_SECONDS; a delete handler removes the children.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import kopf
from prometheus_client import start_http_server

from rlt_operator.apply.writes import claim_disowned, owns_object
from rlt_operator.cluster.api_session import counted_login
from rlt_operator.cluster.events import COMPONENT, Recorder
from rlt_operator.cluster.kube import Kube, KubeError, NotLeader
from rlt_operator.cluster.leader import Elector, LeaseConfig, elect
from rlt_operator.cluster.peering_watch import PeeringInfo, watch_peering
from rlt_operator.cluster.state import OperatorState, operator_metrics
from rlt_operator.config.kinds import CHILDREN, RUN
from rlt_operator.config.settings import OperatorSettings
from rlt_operator.status.decision import SOON
from rlt_operator.status.observed import summarize

from . import builders
from .reconcile import RunMemory, reconcile_once

log = logging.getLogger("rlt.operator")

FINALIZER = f"{builders.PREFIX}/finalizer"
# How often a run's loop looks again whether this replica may act (it acts within this of taking the Lease).
FOLLOWER_POLL = 0.5
# The longest the stop path waits for the leader Lease's release.
RELEASE_TIMEOUT = 0.5


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
    # At shutdown Kopf gives each watch's workers this long before cancelling them (2 s by default). A standby's
    # peering worker sleeps until the working replica's record would expire, so it always took the full 2 s;
    # unprocessed events are re-listed by the next process anyway.
    settings.queueing.exit_timeout = 0.5
    # Children are watched server-side filtered: the API server sends only objects with the run label, so
    # memory and watch traffic grow with the runs, not with everything else in the namespaces.
    for child in CHILDREN:
        settings.watching.label_selectors[_is(child.group, child.plural)] = builders.L_RUN
    settings.posting.level = logging.WARNING  # our own Events are explicit; Kopf posts only its errors
    settings.posting.reporting_component = COMPONENT  # those, too, say From rlt-operator
    instance = config.pod_id or COMPONENT  # this replica (POD_ID, the chart sets it)
    settings.posting.reporting_instance = instance
    # Peering (standalone, or several replicas with one working) is chosen by the caller: `rlt operator --peering`.

    metrics = operator_metrics(memo)
    kube = Kube.from_environment()
    kube.on_request = metrics.api_request
    state = OperatorState(kube=kube, metrics=metrics, settings=config, recorder=Recorder(kube, instance))
    info: PeeringInfo | None = getattr(memo, "peering", None)
    lease: LeaseConfig | None = getattr(memo, "lease", None)
    if info is None:  # standalone: this replica is the one that works
        state.metrics.active(True)
    else:
        state.metrics.active(False)  # until the peering object says so
        state.yielded[""] = "this replica has not yet checked for other rlt installs in its scope"
        # The peering watch and the election read and write with their own client: never fenced.
        state.peer_kube = Kube.from_environment()
        state.peer_kube.on_request = metrics.api_request
        state.peering_task = asyncio.create_task(watch_peering(state, info, logger), name="rlt peering watch")
    if lease is not None:
        own = Kube.from_environment()
        own.on_request, own.timeout = metrics.api_request, lease.renew_deadline
        # every write of the handlers: fenced at the moment it is sent, and answered before the Lease is released
        state.elector = Elector(lease, own, writes_settled=kube.writes_settled)
        kube.may_write = state.elector.leads
        state.election_task = asyncio.create_task(
            elect(state.elector, lambda: state.kopf_works, state.metrics.active, logger), name="rlt leader election"
        )
    if config.metrics_port >= 0:
        server, _thread = start_http_server(config.metrics_port, addr=config.metrics_addr, registry=metrics.registry)
        state.metrics_server = server
        logger.info(f"operator metrics on :{server.server_port}/metrics")
    memo.rlt = state


@kopf.on.login(id="login")
async def login(logger: Any, settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> kopf.AiohttpSession | None:
    """Kopf's own login, on a session whose requests are counted (api_session)."""
    return await counted_login(logger, settings, operator_metrics(memo).api_trace())


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    state: OperatorState | None = getattr(memo, "rlt", None)
    if state is not None and state.peering_task is not None:
        state.peering_task.cancel()
    if state is not None and state.election_task is not None:
        state.election_task.cancel()
    if state is not None and state.elector is not None:
        await _release(state.elector)
    if state is not None and state.metrics_server is not None:
        # shutdown() blocks until the server's loop notices (it polls every 0.5 s, longer on a loaded machine): in
        # a thread of its own, not in the stop path.
        server = state.metrics_server

        def close() -> None:
            server.shutdown()
            server.server_close()

        threading.Thread(target=close, name="rlt metrics shutdown", daemon=True).start()


async def _release(elector: Elector) -> None:
    """Hand the Lease over on the way out (a standby takes it at its next try), bounded: an API that does not answer,
    or a write of the handlers still unanswered, costs at most RELEASE_TIMEOUT (the standby then waits out the
    lease)."""
    elector.leave()  # first: nothing acts from here on, whatever the release does
    if elector.holder != elector.config.identity:
        return  # a standby: nothing to hand over, no request in the stop path
    elector.kube.timeout = RELEASE_TIMEOUT
    try:
        released = await asyncio.wait_for(asyncio.to_thread(elector.release, RELEASE_TIMEOUT), RELEASE_TIMEOUT)
        if not released:
            log.info(
                f"leader Lease not cleared (no longer this replica's, or a write still unanswered after "
                f"{RELEASE_TIMEOUT:g}s): a standby takes it when it expires"
            )
    except Exception as err:  # noqa: BLE001 - best effort: the lease expires anyway
        log.info(f"leader Lease not released ({err or type(err).__name__}): a standby takes it when it expires")


@kopf.on.probe(id="runs")
def probe_runs(memo: kopf.Memo, **_: Any) -> int:
    """Liveness detail: how many runs have a reconcile loop."""
    state: OperatorState | None = getattr(memo, "rlt", None)
    return len(state.wakers) if state else 0


# --------------------------------------------------------------------------- children: indices + wake-ups


def _register_child(group: str, version: str, plural: str) -> None:
    # async: Kopf would run a sync function in its thread pool, a hop per watch event for a dict copy.
    async def index(
        namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
    ) -> dict[tuple[str, str], dict[str, Any]]:
        return {(namespace or "", labels[builders.L_RUN]): summarize(plural, dict(body))}

    async def wake(namespace: str | None, labels: Mapping[str, str], memo: Any, **_: Any) -> None:
        state: OperatorState | None = getattr(memo, "rlt", None)
        if state is not None:
            state.wake(namespace, labels.get(builders.L_RUN))

    owned = {builders.L_RUN: kopf.PRESENT}
    kopf.index(group, version, plural, id=f"rlt_{plural}", labels=owned)(index)
    kopf.on.event(group, version, plural, id=f"wake_{plural}", labels=owned)(wake)


for _child in CHILDREN:
    _register_child(_child.group, _child.version, _child.plural)


@kopf.on.event(RUN.group, RUN.version, RUN.plural, id="wake_run")
async def wake_run(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    memo.rlt.wake(namespace, name)


@kopf.daemon(RUN.group, RUN.version, RUN.plural, id="reconcile", cancellation_timeout=5.0)
async def reconcile_loop(
    name: str,
    namespace: str | None,
    body: kopf.Body,
    memo: Any,
    stopped: kopf.DaemonStopped,
    logger: Any,
    **kwargs: Any,
) -> None:
    assert namespace is not None, "an RLTRun is namespaced"
    state: OperatorState = memo.rlt
    indices = {f"rlt_{c.plural}": kwargs[f"rlt_{c.plural}"] for c in CHILDREN}
    wake = state.waker(namespace, name)
    mem = RunMemory()
    following = False
    try:
        while not stopped:
            if state.gives_way(namespace) or not state.leads():  # another install or replica reconciles this run
                # What this loop remembers is stale once another acts: a fresh start, as a new process, reading the
                # run's status from the server when this replica leads again.
                mem = RunMemory()
                if not following:  # so are this replica's series of the run, served beside the acting one's
                    state.metrics.forget(namespace, name)
                    following = True
                await asyncio.sleep(FOLLOWER_POLL)
                continue
            following = False
            wake.clear()
            t0 = time.perf_counter()
            try:
                requeue = await reconcile_once(state, body, mem, indices, logger)
                state.metrics.reconciled("success" if requeue is None else "requeue_after", time.perf_counter() - t0)
                state.metrics.reconciled_run(namespace, name, True, time.time())
            except NotLeader:
                # The fence closed mid-pass (the Lease not renewed in time): the rest of the pass was not written;
                # the next leader reconciles from what it observes.
                logger.info("stopped mid-pass: this replica no longer holds the leader Lease")
                mem = RunMemory()
                requeue = SOON
            except KubeError as err:
                # The loop must survive API hiccups; the next pass retries from observed state.
                logger.error(f"reconcile failed, retrying in {SOON * 2:.0f}s: {err}")
                state.metrics.reconciled("error", time.perf_counter() - t0)
                state.metrics.reconciled_run(namespace, name, False, time.time())
                mem.status = None  # re-read what the server has
                requeue = SOON * 2
            except Exception:
                # A bug must not stall this run forever nor touch the others: loud, counted, retried.
                logger.exception(f"reconcile crashed, retrying in {SOON * 2:.0f}s")
                state.metrics.reconciled("error", time.perf_counter() - t0)
                state.metrics.reconciled_run(namespace, name, False, time.time())
                mem.status = None  # re-read what the server has
                requeue = SOON * 2
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
        # Kopf stops the daemon when its peering pauses this replica (or the run or operator goes): no stale series.
        state.metrics.forget(namespace, name)


# --------------------------------------------------------------------------- deletion


@kopf.on.delete(RUN.group, RUN.version, RUN.plural, id="cleanup")
async def cleanup(
    name: str, namespace: str | None, spec: kopf.Spec, meta: kopf.Meta, memo: Any, logger: Any, **_: Any
) -> None:
    """Delete every child now (owner references would let a cluster's GC do it later; kmock has none)."""
    assert namespace is not None, "an RLTRun is namespaced"
    state: OperatorState = memo.rlt
    while state.gives_way(namespace) or not state.leads():  # the other install or the leader deletes the children
        # (and the run then goes): wait, write nothing (a retry would write Kopf's progress annotation, which both
        # installs read)
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
                if (body := claim_disowned(ref, obj)) is not None:  # created under Delete, kept now
                    await asyncio.to_thread(state.kube.patch, child.plural, namespace, m["name"], body)
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
