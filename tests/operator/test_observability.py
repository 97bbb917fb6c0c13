"""Progress from a real rlt_* exporter, the operator's own /metrics, liveness, and Events.
Child status is simulated by the test (kmock has no controllers)."""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.metadata
import re
import urllib.request

import pytest
from op_harness import example
from prometheus_client import CollectorRegistry, generate_latest
from suite_helpers import PYPROJECT_VERSION, free_port

from rlt.contract.metrics import TrainerMetrics
from rlt_operator.cluster.operator_metrics import OperatorMetrics
from rlt_operator.config.kinds import CHILDREN

pytestmark = pytest.mark.timeout(60)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=3) as r:
        return r.read().decode()


async def test_progress_from_the_trainer_metrics_endpoint(harness, monkeypatch):
    trainer = TrainerMetrics(run="tiny", namespace="default")
    port = trainer.serve(0)
    try:
        # Stands in for pod 0 of the Job (http://tiny-rl-0.tiny-rl.default.svc:9400/metrics in a cluster).
        monkeypatch.setenv("RLT_PROGRESS_URL", f"http://127.0.0.1:{port}/metrics?job={{job}}")
        # Nothing changes in the cluster between two reads: the operator must come back for progress by itself,
        # at the progress interval, not only at the (here very long) resync.
        monkeypatch.setenv("RLT_RESYNC_SECONDS", "600")
        trainer.stage = "rl"
        trainer.set("rlt_step", 4)
        trainer.set("rlt_total_steps", 125)
        trainer.set("rlt_reward_mean", -0.75)
        trainer.set("rlt_checkpoint_step", 4)
        trainer.inc("rlt_generated_tokens_total", 1000)
        await harness.start_operator()
        await harness.create_run(example(**{"spec.stages.sft.enabled": False}))
        await harness.trainer_running("tiny", "rl")
        st = await harness.wait_status("tiny", lambda s: (s.get("progress") or {}).get("step") == 4, "progress")
        p = st["progress"]
        assert (p["totalSteps"], p["rewardMean"]) == (125, -0.75)
        assert p["lastCheckpoint"] == "/data/tiny/rl/checkpoints/checkpoint-4"
        trainer.set("rlt_step", 5)
        trainer.inc("rlt_generated_tokens_total", 5000)
        st = await harness.wait_status("tiny", lambda s: s["progress"].get("tokensPerSecond", 0) > 0, "tokens/s")
        assert st["progress"]["step"] == 5
    finally:
        trainer.shutdown()


async def test_operator_metrics_liveness_and_events(harness, monkeypatch):
    mport, lport = free_port(), free_port()
    monkeypatch.setenv("RLT_OPERATOR_METRICS_PORT", str(mport))
    await harness.start_operator(liveness=f"http://127.0.0.1:{lport}/healthz")
    await harness.create_run(example())

    def job_seen(st: dict) -> bool:
        trainer = {c["type"]: c for c in st.get("conditions") or []}.get("TrainerRunning") or {}
        return "trainer pods running" in (trainer.get("message") or "")

    await harness.wait_status("tiny", job_seen, "the operator sees the trainer Job")

    def scraped(phase: str):
        async def probe():
            text = await asyncio.to_thread(get, f"http://127.0.0.1:{mport}/metrics")
            return text if f'rlt_run_phase{{namespace="default",phase="{phase}",run="tiny"}} 1.0' in text else None

        return probe

    # Its Job exists, none of its pods runs: the dashboard (count by phase) counts it Pending, not Running.
    text = await harness.wait(scraped("Pending"), "phase gauge Pending")
    assert 'rlt_run_phase{namespace="default",phase="Running",run="tiny"} 0.0' in text
    await harness.trainer_running("tiny", "sft")
    await harness.wait_status("tiny", lambda s: s.get("phase") == "Running", "Running")
    text = await harness.wait(scraped("Running"), "phase gauge")
    assert 'rlt_run_info{method="rlt",namespace="default",run="tiny",stage="sft"} 1.0' in text
    assert re.search(
        r'controller_runtime_reconcile_total\{controller="rltrun",result="(success|requeue_after)"\} [1-9]', text
    )
    assert 'controller_runtime_reconcile_time_seconds_bucket{controller="rltrun",le="+Inf"}' in text
    assert 'rlt_run_restarts{namespace="default",run="tiny"} 0.0' in text
    # on-call: the run's conditions as series, its last reconcile, and this (standalone) replica working
    assert 'rlt_run_condition{namespace="default",reason="Valid",run="tiny",status="True",type="SpecValid"} 1.0' in text
    assert re.search(r'rlt_run_last_reconcile_timestamp_seconds\{namespace="default",run="tiny"\} 1\.\d+e\+09', text)
    assert "rlt_operator_active 1.0" in text

    health = await asyncio.to_thread(get, f"http://127.0.0.1:{lport}/healthz")
    assert '"runs": 1' in health

    events = await harness.wait(lambda: harness.events("tiny"), "events")
    assert {"StageStarted", "Running"} <= {e["reason"] for e in events}
    assert all(e["involvedObject"]["kind"] == "RLTRun" for e in events)


async def test_a_replica_that_stops_acting_stops_serving_the_runs_series(harness, monkeypatch):
    """A replica that worked and then gave way (another install, or the leader Lease lost) would otherwise serve its
    last TrainerRunning=True and phase beside the acting replica's: RLTRunStalled and the phase counts read both."""
    mport = free_port()
    monkeypatch.setenv("RLT_OPERATOR_METRICS_PORT", str(mport))
    await harness.start_operator()
    await harness.create_run(example())
    await harness.trainer_running("tiny", "sft")

    def scraped(present: bool):
        async def probe():
            text = await asyncio.to_thread(get, f"http://127.0.0.1:{mport}/metrics")
            has = re.search(r'^rlt_run_(phase|condition|info|step)\{[^}]*run="tiny"', text, re.M) is not None
            return text if has == present else None

        return probe

    await harness.wait(scraped(True), "the run's series")
    state = harness.operator.memo.rlt
    state.yielded["default"] = "test: an older install works here"  # what watch_peering sets
    text = await harness.wait(scraped(False), "the run's series gone while this replica does not act")
    assert re.search(r'^rlt_run_\w+\{[^}]*run="tiny"', text, re.M) is None, "every per-run series goes"
    del state.yielded["default"]
    await harness.wait(scraped(True), "the run's series back once it acts again")


def series_sum(text: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when there is none)."""
    total = 0.0
    for found in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', found.group(1)))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(found.group(2))
    return total


async def test_operator_metrics_named_as_controller_runtimes(harness, monkeypatch):
    """The series a controller-runtime operator exports, from the operator's real /metrics: Kopf's API requests and
    our client's by code and method (rest_client_requests_total), reconciles by result, a create the API server
    refused (by kind and reason), and the process's own series."""
    mport = free_port()
    monkeypatch.setenv("RLT_OPERATOR_METRICS_PORT", str(mport))
    quota = 'jobs.batch "tiny-sft" is forbidden: exceeded quota: gpu, requested: requests.nvidia.com/gpu=1'
    refusal = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}
    # the real create only: a 403 to the dry-run before it is left to the create (rlt_operator.apply.dry_run)
    real_create = harness.cluster[
        "post", re.compile(r".*/namespaces/default/jobs$"), lambda r: "dryRun" not in r.params
    ]
    real_create[:1] << 403 << {**refusal, "message": quota}
    await harness.start_operator()

    # Before any run: only Kopf has talked to the API server (a list and a watch per watched kind), on its session.
    text = await asyncio.to_thread(get, f"http://127.0.0.1:{mport}/metrics")
    assert series_sum(text, "rest_client_requests_total", code="200", method="GET") >= len(CHILDREN) + 1, text
    assert "process_resident_memory_bytes" in text and "python_info{" in text
    # which build this replica runs (rlt's version is pyproject's, the one the images are tagged with)
    kopf_version = importlib.metadata.version("kopf")
    assert f'rlt_operator_build_info{{kopf_version="{kopf_version}",version="{PYPROJECT_VERSION}"}} 1.0' in text
    assert series_sum(text, "controller_runtime_reconcile_errors_total", controller="rltrun") == 0
    assert 'controller_runtime_reconcile_total{controller="rltrun",result="error"} 0.0' in text

    await harness.create_run(example())

    async def refused():
        text = await asyncio.to_thread(get, f"http://127.0.0.1:{mport}/metrics")
        kinds = dict(kind="Job", verb="create", reason="Forbidden")
        return text if series_sum(text, "rlt_operator_child_refusals_total", **kinds) == 1 else None

    text = await harness.wait(refused, "the refused Job create counted")
    assert series_sum(text, "rest_client_requests_total", code="403", method="POST") == 1  # the refused create
    assert series_sum(text, "rest_client_requests_total", code="201", method="POST") >= 2  # ConfigMap, claim, ...
    assert series_sum(text, "rest_client_requests_total", method="PATCH") >= 1  # the status, Kopf's finalizer

    async def reconciled():  # the refused create was in the run's first reconcile, which is counted when it ends
        text = await asyncio.to_thread(get, f"http://127.0.0.1:{mport}/metrics")
        return text if series_sum(text, "controller_runtime_reconcile_total", controller="rltrun") >= 1 else None

    text = await harness.wait(reconciled, "a reconcile counted")
    assert series_sum(text, "controller_runtime_reconcile_time_seconds_count", controller="rltrun") >= 1
    assert series_sum(text, "controller_runtime_reconcile_errors_total") == 0  # a refused child is no failed reconcile


def test_condition_series_are_one_per_condition_type_and_go_with_the_run():
    """Bounded cardinality: a condition whose status or reason changes replaces its series; a deleted run leaves
    none; a run that never reconciled reads 0 (no status: RLTRunNotReconciled)."""
    metrics = OperatorMetrics(CollectorRegistry())

    def series() -> list[str]:
        text = generate_latest(metrics.registry).decode()
        return [line for line in text.splitlines() if line.startswith(("rlt_run_condition{", "rlt_run_last_reconcile"))]

    def st(reason: str) -> dict:
        return {"phase": "Running", "conditions": [{"type": "TrainerRunning", "status": "False", "reason": reason}]}

    metrics.reconciled_run("ns", "a", False, 1e9)
    assert series() == ['rlt_run_last_reconcile_timestamp_seconds{namespace="ns",run="a"} 0.0']
    metrics.run("ns", "a", st("WaitingForPods"), "rlt")
    metrics.run(
        "ns",
        "a",
        st("Running") | {"conditions": [{"type": "TrainerRunning", "status": "True", "reason": "Running"}]},
        "rlt",
    )
    metrics.reconciled_run("ns", "a", True, 1.7e9)
    metrics.reconciled_run("ns", "a", False, 1.8e9)  # an error after a success keeps the success's time
    assert series() == [
        'rlt_run_condition{namespace="ns",reason="Running",run="a",status="True",type="TrainerRunning"} 1.0',
        'rlt_run_last_reconcile_timestamp_seconds{namespace="ns",run="a"} 1.7e+09',
    ]
    # a condition the status no longer carries (PodsHealthy once a suspended run's pods are gone) leaves no series
    healthy = {"type": "PodsHealthy", "status": "False", "reason": "CrashLoopBackOff"}
    metrics.run("ns", "a", {"phase": "Running", "conditions": [healthy]}, "rlt")
    assert any('type="PodsHealthy"' in line for line in series()), series()
    metrics.run("ns", "a", {"phase": "Suspended", "conditions": []}, "rlt")
    assert not any(line.startswith("rlt_run_condition{") for line in series()), series()
    metrics.forget("ns", "a")
    assert series() == []


def test_the_step_timestamp_moves_only_with_the_stage_or_step_and_goes_with_the_run(monkeypatch):
    """rlt_run_step_timestamp_seconds (RLTRunStalled's clock): set when the run is first seen and whenever its stage
    or step changes; a reconcile without progress leaves it as it was."""
    from rlt_operator.cluster import operator_metrics

    metrics = OperatorMetrics(CollectorRegistry())
    clock = iter([100.0, 200.0, 300.0, 400.0, 500.0])
    monkeypatch.setattr(operator_metrics.time, "time", lambda: next(clock))

    def at() -> float | None:
        text = generate_latest(metrics.registry).decode()
        found = re.search(r'^rlt_run_step_timestamp_seconds\{namespace="ns",run="a"\} (\S+)$', text, re.M)
        return float(found.group(1)) if found else None

    def st(stage: str, step: int) -> dict:
        return {"phase": "Running", "stage": stage, "progress": {"step": step}}

    metrics.run("ns", "a", st("sft", 3), "rlt")
    assert at() == 100.0
    metrics.run("ns", "a", st("sft", 3), "rlt")  # no progress: the clock runs on
    assert at() == 100.0
    metrics.run("ns", "a", st("sft", 4), "rlt")
    assert at() == 200.0
    metrics.run("ns", "a", st("rl", 4), "rlt")  # a new stage is progress, whatever its step
    assert at() == 300.0
    metrics.forget("ns", "a")
    assert at() is None


def test_the_stall_clock_starts_no_earlier_than_the_trainer_runs():
    """A trainer that waited for its pods (an image, a quota) longer than the stall threshold has not stalled: once it
    runs, the clock starts at TrainerRunning's transition (kept in the status: an operator restart keeps it)."""
    metrics = OperatorMetrics(CollectorRegistry())

    def at() -> float:
        text = generate_latest(metrics.registry).decode()
        found = re.search(r'^rlt_run_step_timestamp_seconds\{namespace="ns",run="a"\} (\S+)$', text, re.M)
        assert found
        return float(found.group(1))

    def st(trainer: str, since: str) -> dict:
        cond = {"type": "TrainerRunning", "status": trainer, "reason": "x", "lastTransitionTime": since}
        return {"phase": "Running", "stage": "rl", "conditions": [cond], "progress": {"stepTime": T_STEP}}

    metrics.run("ns", "a", st("False", "2026-01-01T12:00:00Z"), "rlt")
    assert at() == dt.datetime(2026, 1, 1, 11, 0, tzinfo=dt.timezone.utc).timestamp()
    metrics.run("ns", "a", st("True", "2026-01-01T12:40:00Z"), "rlt")  # runs after 40 min of waiting
    assert at() == dt.datetime(2026, 1, 1, 12, 40, tzinfo=dt.timezone.utc).timestamp()
    fresh = OperatorMetrics(CollectorRegistry())  # a restarted operator reads the same from the status
    metrics = fresh
    metrics.run("ns", "a", st("True", "2026-01-01T12:40:00Z"), "rlt")
    assert at() == dt.datetime(2026, 1, 1, 12, 40, tzinfo=dt.timezone.utc).timestamp()


T_STEP = "2026-01-01T11:00:00Z"
