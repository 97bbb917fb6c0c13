"""What all handlers of one operator process share (kept in Kopf's root memo)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from rlt_operator.cluster.events import Recorder
from rlt_operator.cluster.kube import Kube
from rlt_operator.cluster.leader import Elector
from rlt_operator.cluster.operator_metrics import OperatorMetrics
from rlt_operator.config.settings import OperatorSettings


@dataclass
class OperatorState:
    """Shared by all handlers of one operator process (kept in Kopf's root memo)."""

    kube: Kube
    metrics: OperatorMetrics
    settings: OperatorSettings
    wakers: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    metrics_server: Any = None
    peering_task: asyncio.Task[None] | None = None
    peer_kube: Kube | None = None  # the peering watch's client (unfenced); None: `kube`
    recorder: Recorder | None = None  # the runs' Events (rlt_operator.cluster.events)
    # Scopes ("" = every namespace) where this install gives way to an older rlt install (watch_peering): its
    # replicas reconcile no run there. Until the first check, every scope (the check takes one list call).
    yielded: dict[str, str] = field(default_factory=dict)
    # With several replicas: the leader Lease (rlt_operator.cluster.leader). A replica acts only while it holds it.
    elector: Elector | None = None
    election_task: asyncio.Task[None] | None = None
    # Whether Kopf's peering lets this replica work (watch_peering): only then is it a candidate for the Lease.
    kopf_works: bool = False

    def leads(self) -> bool:
        """Whether this replica may act now: it holds the leader Lease within its renew deadline (always, without
        an election: one replica)."""
        return self.elector is None or self.elector.leads()

    def gives_way(self, namespace: str) -> str | None:
        """Why this install does not reconcile runs in `namespace` (another install works there), or None."""
        return self.yielded.get("") or self.yielded.get(namespace)

    def waker(self, namespace: str, name: str) -> asyncio.Event:
        return self.wakers.setdefault((namespace, name), asyncio.Event())

    def wake(self, namespace: str | None, name: str | None) -> None:
        ev = self.wakers.get((namespace or "", name or ""))
        if ev is not None:
            ev.set()


def operator_metrics(memo: Any) -> OperatorMetrics:
    """The process's metrics, made by whichever needs them first: the login (before Kopf's first request, which it
    counts) or the start-up; kept in Kopf's root memo."""
    metrics: OperatorMetrics | None = getattr(memo, "rlt_metrics", None)
    if metrics is None:
        metrics = memo.rlt_metrics = OperatorMetrics(CollectorRegistry())
    return metrics
