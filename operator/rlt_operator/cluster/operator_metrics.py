"""The operator's own Prometheus series: the runs' phase, conditions and progress clock; the reconciles, the API
requests and the refused child writes (named as controller-runtime's); and the process's own series.

Names from rlt.contract.metrics.OPERATOR_METRICS (the one catalogue); the handlers call these methods only.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import time
import urllib.parse
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

from rlt import __version__
from rlt.contract import metrics as catalogue
from rlt.contract.api import Phase
from rlt.contract.layout import parse_time
from rlt.contract.metrics import CONTROLLER, OPERATOR_METRICS, RECONCILE_RESULTS, build
from rlt_operator.cluster.kube import NO_ANSWER
from rlt_operator.config.kinds import BY_PLURAL


def build_labels() -> dict[str, str]:
    """What this operator is: rlt's version and the installed Kopf's, as its start line and rlt_operator_build_info
    both say them (read once here, so the two cannot disagree)."""
    return {"version": __version__, "kopf_version": importlib.metadata.version("kopf")}


class OperatorMetrics:
    """The operator's Prometheus series (names from rlt.contract.metrics.OPERATOR_METRICS)."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self.m = build(OPERATOR_METRICS, registry)
        # process_* (CPU, memory, open files) and python_* series, as prometheus_client's default registry has them:
        # the operator serves its own registry, which has none until added.
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        for result in RECONCILE_RESULTS:  # as controller-runtime does: every result reads 0 before it first happens
            self.m[catalogue.RECONCILES].labels(controller=CONTROLLER, result=result)
        self.m[catalogue.RECONCILE_ERRORS].labels(controller=CONTROLLER)
        build_info = self.m[catalogue.OPERATOR_BUILD_INFO]
        build_info.labels(**build_labels()).set(1)
        self._info: dict[tuple[str, str], tuple[str, str]] = {}
        self._conditions: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
        self._reconciled: set[tuple[str, str]] = set()
        # (stage, step, since when the trainer runs) last seen per run
        self._progress: dict[tuple[str, str], tuple[str, int, str | None]] = {}

    def reconciled(self, result: str, seconds: float) -> None:
        """One reconcile of a run (result: one of RECONCILE_RESULTS), counted as controller-runtime counts it."""
        if result not in RECONCILE_RESULTS:
            raise ValueError(f"reconcile result {result!r} is not one of {RECONCILE_RESULTS}")
        self.m[catalogue.RECONCILES].labels(controller=CONTROLLER, result=result).inc()
        if result == "error":
            self.m[catalogue.RECONCILE_ERRORS].labels(controller=CONTROLLER).inc()
        self.m[catalogue.RECONCILE_SECONDS].labels(controller=CONTROLLER).observe(seconds)

    def api_request(self, url: str, method: str, code: str) -> None:
        """One request to the API server (code: its HTTP status, or NO_ANSWER), as client-go counts it."""
        host = urllib.parse.urlsplit(url).netloc.rpartition("@")[2]
        self.m[catalogue.REST_CLIENT_REQUESTS].labels(code=code, method=method.upper(), host=host).inc()

    def api_trace(self) -> aiohttp.TraceConfig:
        """Counts the requests of an aiohttp session (Kopf's: see the login handler) in api_request."""

        async def answered(_session: Any, _ctx: Any, params: aiohttp.TraceRequestEndParams) -> None:
            self.api_request(str(params.url), params.method, str(params.response.status))

        async def failed(_session: Any, _ctx: Any, params: aiohttp.TraceRequestExceptionParams) -> None:
            self.api_request(str(params.url), params.method, NO_ANSWER)

        trace = aiohttp.TraceConfig()
        trace.on_request_end.append(answered)
        trace.on_request_exception.append(failed)
        return trace

    def refused(self, plural: str, verb: str, reason: str) -> None:
        """A write of a run's child the API server refused (rlt_operator.apply.writes.rejected), by kind, verb, reason."""
        self.m[catalogue.CHILD_REFUSALS].labels(kind=BY_PLURAL[plural].kind, verb=verb, reason=reason).inc()

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
        # One series per condition type: a changed status or reason replaces it (bounded: types x runs); a type
        # the status no longer has (PodsHealthy once the pods are gone, Failed once a run is retried) goes too.
        had = self._conditions.setdefault((namespace, name), {})
        present = {c["type"] for c in run_status.get("conditions") or []}
        for gone in [t for t in had if t not in present]:
            _remove(self.m[catalogue.RUN_CONDITION], namespace, name, gone, *had.pop(gone))
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
