"""Leader election by a coordination.k8s.io/v1 Lease, with client-go's rules (k8s.io/client-go/tools/leaderelection):
which of several `rlt operator --peering` replicas may act (docs/decisions/leader-lease.md).

- A candidate takes the Lease when it is free (no holder, or released) or when the record it reads has not
  changed for the record's leaseDurationSeconds, as measured on the candidate's own clock (never the writer's
  renewTime: clocks differ). The write carries the resourceVersion read, so of two candidates one wins (409).
- The holder renews every retry period. It may act only until `renew_deadline` after it *sent* its last successful
  renewal: measured from before the request, which the server applied later, so from before any other candidate
  could have seen that record. renew_deadline < lease_duration: the holder stops acting at least
  lease_duration - renew_deadline before any other may take over, even if it was frozen (SIGSTOP, a starved CPU)
  and its renewals never went out. `leads()` reads the clock each time: it needs no task to run to turn false.
- A holder that leaves (SIGTERM, or Kopf's peering pauses it) stops acting first, then waits (at most the stop
  path's RELEASE_TIMEOUT on SIGTERM, a retry period when paused) for its writes already on the wire to be answered,
  then releases the Lease (holder cleared, one-second duration) so that a standby takes it at its next try rather
  than after the lease duration. A write still unanswered then keeps the Lease named: the standby waits out the
  lease, the fence's margin covers the write.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlt.contract.layout import MICRO_TIME_FORMAT, format_time
from rlt_operator.cluster.kube import Kube
from rlt_operator.config.kinds import LEASE

# client-go's defaults (leaderelection.LeaderElectionConfig, as controller-runtime sets them).
DEFAULT_LEASE_DURATION = 15.0
DEFAULT_RENEW_DEADLINE = 10.0
DEFAULT_RETRY_PERIOD = 2.0


@dataclass(frozen=True)
class LeaseConfig:
    name: str
    namespace: str
    identity: str
    lease_duration: float = DEFAULT_LEASE_DURATION
    renew_deadline: float = DEFAULT_RENEW_DEADLINE
    retry_period: float = DEFAULT_RETRY_PERIOD


def timing_problem(lease_duration: float, renew_deadline: float, retry_period: float) -> str | None:
    """Why these durations cannot fence (client-go refuses the same), or None."""
    if not 0 < retry_period < renew_deadline:
        return f"--retry-period ({retry_period:g}s) must be above 0 and below --renew-deadline ({renew_deadline:g}s)"
    if renew_deadline >= lease_duration:
        return (
            f"--renew-deadline ({renew_deadline:g}s) must be below --lease-duration ({lease_duration:g}s): the leader "
            "must stop acting before another replica may take the lease"
        )
    if lease_duration != int(lease_duration):
        return f"--lease-duration ({lease_duration:g}s): whole seconds (the Lease's leaseDurationSeconds)"
    return None


def micro_time(at: dt.datetime) -> str:
    """A MicroTime as the API server writes it (RFC 3339, microseconds, UTC)."""
    return format_time(at, MICRO_TIME_FORMAT)


def _record(lease: dict[str, Any]) -> tuple[Any, ...]:
    spec = lease.get("spec") or {}
    keys = ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime", "leaseTransitions")
    return tuple(spec.get(k) for k in keys)


class Elector:
    """One replica's side of the election. `attempt` is one client-go tryAcquireOrRenew (blocking: run it in a
    thread); `leads` says whether this replica may act now. `clock` is monotonic (time.monotonic keeps counting
    while the process is stopped); `wall` only writes the Lease's timestamps, which no replica trusts."""

    def __init__(
        self,
        config: LeaseConfig,
        kube: Kube,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
        writes_settled: Callable[[float], bool] = lambda _timeout: True,
    ):
        self.config, self.kube, self.clock, self.wall = config, kube, clock, wall
        # Waits until the fenced client's writes on the wire are answered (Kube.writes_settled): before a release.
        self.writes_settled = writes_settled
        self.renewed_at: float | None = None  # clock before the last successful acquire/renew was sent
        self.observed: tuple[Any, ...] | None = None  # the last Lease record read
        self.observed_at = 0.0  # when that record was first seen unchanged
        self.holder = ""  # who the last record read names
        self.closed = False  # leaving: an attempt still running in its thread must not take the Lease back
        # `closed` and a new `renewed_at` change as one step: a renewal answered while the replica leaves cannot let
        # it act again after it stepped down.
        self._leaving = threading.Lock()

    def leads(self) -> bool:
        renewed = self.renewed_at  # read once: an attempt's thread may clear it meanwhile
        return renewed is not None and self.clock() < renewed + self.config.renew_deadline

    def _held_since(self, sent: float) -> bool:
        """Record a successful acquire or renewal sent at `sent`; False (and no lead) when the replica is leaving."""
        with self._leaving:
            if self.closed:
                return False
            self.renewed_at = sent
            return True

    def _observe(self, lease: dict[str, Any]) -> None:
        record = _record(lease)
        if record != self.observed:
            self.observed, self.observed_at = record, self.clock()
        self.holder = str((lease.get("spec") or {}).get("holderIdentity") or "")

    def attempt(self, candidate: bool) -> bool:
        """Read the Lease; take or renew it when `candidate` and the rules allow, release it when not `candidate` and
        it is this replica's. True if this replica holds it now."""
        cfg = self.config
        sent = self.clock()
        lease = self.kube.get(LEASE.plural, cfg.namespace, cfg.name)
        if lease is None:
            self.renewed_at = None
            if not candidate or self.closed:
                return False
            meta = {"name": cfg.name, "namespace": cfg.namespace}
            body = {"apiVersion": LEASE.api_version, "kind": LEASE.kind, "metadata": meta, "spec": self._spec(None, 0)}
            if self.kube.create(LEASE.plural, cfg.namespace, body, find=False) is not None:
                return False  # another candidate created it first
            self.holder = cfg.identity
            return self._held_since(sent)
        self._observe(lease)
        spec = lease.get("spec") or {}
        mine = self.holder == cfg.identity
        if not candidate or self.closed:
            self.renewed_at = None
            if mine and self.writes_settled(cfg.retry_period):  # else tried again at the next attempt
                self._clear(lease)
            return False
        duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration)
        if not mine and self.holder and self.clock() < self.observed_at + duration:
            self.renewed_at = None
            return False  # held by another, renewed less than its duration ago (as far as this replica saw)
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        written = self.kube.replace(
            LEASE.plural, cfg.namespace, cfg.name, {**lease, "spec": self._spec(spec if mine else None, transitions)}
        )
        if written is None:  # 409: another replica wrote it since it was read
            return self.leads()
        self._observe(written)
        return self._held_since(sent)

    def _clear(self, lease: dict[str, Any]) -> bool:
        spec = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": micro_time(self.wall())}
        return (
            self.kube.replace(LEASE.plural, self.config.namespace, self.config.name, {**lease, "spec": spec})
            is not None
        )

    def _spec(self, held: dict[str, Any] | None, transitions: int) -> dict[str, Any]:
        stamp = micro_time(self.wall())
        return {
            "holderIdentity": self.config.identity,
            "leaseDurationSeconds": int(self.config.lease_duration),
            "acquireTime": (held or {}).get("acquireTime") or stamp,
            "renewTime": stamp,
            "leaseTransitions": transitions,
        }

    def step_down(self) -> None:
        """Stop acting now (the Lease is released separately)."""
        self.renewed_at = None

    def leave(self) -> None:
        """Stop acting for good: no later attempt, nor a renewal already on the wire, makes this replica lead again."""
        with self._leaving:
            self.closed = True
            self.renewed_at = None

    def release(self, settle: float | None = None) -> bool:
        """Leave: stop acting, let the writes on the wire be answered, then clear the holder if it is still this
        replica, so that a standby need not wait out the lease. One read and one write with this Kube's timeout;
        False if the Lease was not ours, a write stayed unanswered for `settle` seconds (default: a retry period) or
        the clearing failed. No later attempt takes it again."""
        self.leave()
        lease = self.kube.get(LEASE.plural, self.config.namespace, self.config.name)
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.config.identity:
            return False
        return self.writes_settled(self.config.retry_period if settle is None else settle) and self._clear(lease)


async def elect(elector: Elector, candidate: Callable[[], bool], changed: Callable[[bool], None], logger: Any) -> None:
    """The election loop, until cancelled: an attempt every retry period (one at a time: a hung request is waited
    for, not doubled), and `changed(leads)` at each change of `leads()`, checked at least every retry period, so a
    loss is said even while an attempt hangs (the fence itself needs no loop: `leads()` reads the clock)."""
    cfg = elector.config
    where = f"Lease {cfg.namespace}/{cfg.name}"
    was, failing = False, False
    attempt: asyncio.Future[bool] | None = None
    wanted = False
    told = ""  # the other holder last said
    while True:
        if attempt is None:
            wanted = candidate()
            if not wanted and elector.leads():
                logger.info(f"this replica is paused by Kopf's peering: it stops acting and releases {where}")
                elector.step_down()
            attempt = asyncio.ensure_future(asyncio.to_thread(elector.attempt, wanted))
        done, _ = await asyncio.wait([attempt], timeout=cfg.retry_period)
        if done:
            try:
                attempt.result()
                if failing:
                    logger.info(f"{where} answers again")
                failing = False
            except Exception as err:  # noqa: BLE001 - the API may be away or slow: tried again next period
                if not failing:
                    logger.warning(f"{where}: cannot read or write it ({err}); trying every {cfg.retry_period:g}s")
                failing = True
            attempt = None
        now = elector.leads()
        if now != was:
            changed(now)
            if now:
                logger.info(f"this replica works (active): it holds {where}")
            elif wanted:
                logger.warning(
                    f"this replica stops acting: it did not renew {where} within {cfg.renew_deadline:g}s (the lease "
                    f"lasts {cfg.lease_duration:g}s; last seen holder: {elector.holder or 'none'})"
                )
            else:
                logger.info("this replica is the standby (not a candidate while Kopf's peering pauses it)")
            was = now
        if wanted and not now and elector.holder and elector.holder != told:
            logger.info(f"this replica is the standby: {elector.holder} holds {where}")
        told = elector.holder
        if done:
            await asyncio.sleep(cfg.retry_period)
