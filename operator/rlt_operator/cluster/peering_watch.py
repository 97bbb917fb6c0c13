"""The peering watch: whether this replica works, whether its peering object is still there, and whether another
rlt install works in the same scope (then the younger install gives way). Kopf's peering says none of these."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

from rlt_operator.cluster import peering
from rlt_operator.cluster.kube import KubeError
from rlt_operator.cluster.state import OperatorState
from rlt_operator.config.kinds import CLUSTER_PEERING, PEERING


@dataclass(frozen=True)
class PeeringInfo:
    """What `rlt operator --peering` passes in the root memo: the object and this replica's record in it."""

    name: str
    identity: str
    priority: int
    namespaces: tuple[str, ...] | None  # None: cluster-wide (a ClusterKopfPeering)
    lifetime: int  # seconds a keep-alive record is valid
    interval: float  # seconds between two checks


# Seconds between two peering checks while a replica starts (watch_peering).
PEERING_FAST_CHECK = 0.25


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
    since: float | None = None  # when this replica's own keep-alive was first seen
    kube = state.peer_kube or state.kube  # not fenced by the leader Lease: Kopf's peering is every replica's
    while True:
        works = True
        yielded = {k: v for k, v in state.yielded.items() if k in where}  # a namespaced scope drops the start guard
        for ns in where:
            what = f"{kind.kind}/{info.name}" + (f" in namespace {ns}" if ns else "")
            try:
                found = await asyncio.to_thread(kube.list, kind.plural, ns, None, f"metadata.name={info.name}")
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
                        record = {"priority": info.priority, "lifetime": info.lifetime, "lastseen": _iso_now()}
                        restored = {"name": info.name, "labels": labels.get(what, {})}
                        meta = {"metadata": restored, "status": {**seen[what], info.identity: record}}
                        made = await asyncio.to_thread(kube.create, kind.plural, ns, {**body, **meta})
                        logger.warning(
                            f"peering object {what} recreated" + ("" if made is None else " (by another replica)")
                        )
                    continue
                missing.discard(what)
                seen[what] = found[0].get("status") or {}
                labels[what] = found[0]["metadata"].get("labels") or {}
                records = found[0].get("status") or {}
                mine, others = peering.working(records, info.identity, info.priority)
                # Kopf works only after its own keep-alive is in the object (it starts paused until then).
                works = works and mine and info.identity in records
                if info.identity in records and since is None:
                    since = time.monotonic()
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
        if since is None and not missing:  # starting: Kopf is paused until its first keep-alive; nothing to say yet
            await asyncio.sleep(PEERING_FAST_CHECK)
            continue
        state.kopf_works = works  # a candidate for the leader Lease only while Kopf's peering lets it work
        if works != was:
            if state.elector is None:  # else the Lease says (rlt_operator.cluster.leader.elect)
                state.metrics.active(works)
            logger.info(
                (
                    "this replica works (active)"
                    if state.elector is None
                    else "Kopf's peering lets this replica work: it is a candidate for the leader Lease"
                )
                if works
                else "this replica is the standby (its install gives way to an older one)"
                if everywhere
                else "this replica is the standby (paused while another works)"
            )
            was = works
        # Replicas started together learn of each other only once both have written a keep-alive: check often
        # until this one's has been there for a whole interval, so the standby says so within PEERING_FAST_CHECK.
        settled = since is not None and time.monotonic() - since >= info.interval
        await asyncio.sleep(info.interval if settled else min(info.interval, PEERING_FAST_CHECK))


async def _say_overlaps(
    state: OperatorState, kind: Any, ns: str, own: dict[str, Any], info: PeeringInfo, told: set[str], logger: Any
) -> list[str]:
    """Another rlt install working in the same scope (its own peering object, live). Said once per install, loudly;
    the cure is disjoint operator.watchNamespaces (docs/operator.md). Returns the older ones, which this install
    gives way to (peering.yields_to): of two installs, one reconciles the runs."""
    objects = await asyncio.to_thread((state.peer_kube or state.kube).list, kind.plural, ns, "=".join(peering.PART_OF))
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
