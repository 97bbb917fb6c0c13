"""Quiet and truthful on-call (issue 53, item 5): a Job's FailedCreate is one counted Event, not one per retry; the
REASON column says why nothing runs while pods have no node; the last-failure evidence is written once per failure,
not at each operator start. Against the kmock API server (tests/operator/op_harness.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import signal
import time

import pytest
from op_harness import NS, PATHS, example
from suite_helpers import free_port
from test_ha import create_peering, start_operator
from test_pods_not_created import _pod

from rlt_operator import builders
from rlt_operator.apply import evidence
from rlt_operator.cluster.kube import Kube
from rlt_operator.status.conditions import pod_conditions
from rlt_operator.status.model import RLTRunStatus

pytestmark = pytest.mark.timeout(90)
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def forbidden(pod: str) -> str:
    return f'Error creating: pods "{pod}" is forbidden: exceeded quota: gpus, requested: nvidia.com/gpu=1'


async def controller_failed_create(harness, job: dict, n: int, pod: str) -> None:
    """The job-controller's FailedCreate Event of its n-th try: each try names the pod it could not create."""
    ref = {"kind": "Job", "name": "tiny-sft", "namespace": NS, "uid": job["metadata"]["uid"]}
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"tiny-sft.{n}", "namespace": NS},
        "involvedObject": ref,
        "reason": "FailedCreate",
        "message": forbidden(pod),
        "type": "Warning",
        "source": {"component": "job-controller"},
        "lastTimestamp": f"2026-01-01T00:00:0{n}Z",
    }
    await harness.call("POST", PATHS["events"].format(ns=NS), body)


async def test_a_jobs_failed_create_retries_count_on_one_event(harness, monkeypatch):
    from rlt_operator import reconcile

    monkeypatch.setattr(reconcile, "FAILED_CREATE_INTERVAL", 0.3)  # read the controller's Events often
    await harness.start_operator()
    await harness.create_run(example())
    job = await harness.wait_object("jobs", "tiny-sft")

    async def ours(count: int):
        evs = [e for e in await harness.events("tiny") if e["reason"] == "FailedCreate"]
        return evs if evs and max(e.get("count", 1) for e in evs) >= count else None

    for n, pod in enumerate(("tiny-sft-0-aaaaa", "tiny-sft-0-bbbbb", "tiny-sft-0-ccccc"), start=1):
        await controller_failed_create(harness, job, n, pod)
        evs = await harness.wait(lambda n=n: ours(n), f"the run's FailedCreate counted {n}", timeout=20)
    assert len(evs) == 1, [(e["metadata"]["name"], e["message"]) for e in evs]  # one per Job, not per pod
    (ev,) = evs
    assert ev["count"] == 3 and ev["message"] == f"Job tiny-sft: {forbidden('tiny-sft-0-ccccc')}"  # the latest try
    assert ev["involvedObject"]["kind"] == "RLTRun" and ev["source"]["component"] == "rlt-operator"


@pytest.mark.parametrize(
    "pod, reason, message",
    [
        (_pod({}), "NotScheduled", "pod t-rl-0-x has no node yet"),
        (
            _pod({}, [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/4 nodes"}]),
            "Unschedulable",
            "pod t-rl-0-x: 0/4 nodes",
        ),
    ],
    ids=["no scheduler's answer", "the scheduler's message"],
)
def test_the_reason_says_why_while_pods_have_no_node(pod, reason, message):
    st = RLTRunStatus()
    pod_conditions(st, [pod], NOW)
    assert (st.reason, st.message) == (reason, message)


async def test_the_evidence_is_written_once_per_failure_not_at_each_operator_start(harness):
    kube = Kube.from_environment()
    ref = builders.RunRef(name="tiny", namespace=NS, uid="u-1")
    status = {"phase": "Failed", "reason": "BackoffLimitExceeded", "message": "m", "lastFailedPod": "tiny-rl-0-a"}
    pods = [{"name": "tiny-rl-0-a", "labels": {}, "ended": {"container": "trainer", "exitCode": 1, "message": "x"}}]
    log = logging.getLogger("test")
    # Three operator processes in turn, each starting with no memory of what it copied (copied=None).
    for i, stamp in enumerate(("2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z")):
        assert await evidence.keep(kube, ref, status, pods, None, stamp, log) == "tiny-rl-0-a", i
    kept = await harness.get("configmaps", "tiny-last-failure")
    assert kept["data"]["copiedAt"] == "2026-01-01T00:00:00Z" and kept["data"]["pod"] == "tiny-rl-0-a"
    rewrites = [
        r
        for r in list(harness.cluster._requests)
        if "configmaps/tiny-last-failure" in r.url.path and str(r.method.value) in ("PATCH", "PUT")
    ]
    assert not rewrites, "the same failure was written again"
    # A new failure (another pod) is copied over it.
    status = {**status, "lastFailedPod": "tiny-rl-0-b"}
    pods = [{**pods[0], "name": "tiny-rl-0-b"}]
    assert await evidence.keep(kube, ref, status, pods, None, "2026-01-01T03:00:00Z", log) == "tiny-rl-0-b"
    kept = await harness.get("configmaps", "tiny-last-failure")
    assert (kept["data"]["pod"], kept["data"]["copiedAt"]) == ("tiny-rl-0-b", "2026-01-01T03:00:00Z")


async def test_sigterm_exits_promptly_with_many_runs(harness, tmp_path):
    """`rlt operator` as the chart runs it (peering, the Lease, /metrics and /healthz on) with 20 runs reconciling:
    SIGTERM → exit 0 within 2 s (1.1 s measured). It took 2.9-3.2 s at load 15-19 on 2 cores: the metrics
    server's shutdown blocked the stop path (it polls every 0.5 s) and the interpreter's teardown of every module
    cost 2 s more after Kopf had stopped; both are out of the stop path now."""
    await create_peering(harness)
    proc, log = await start_operator(harness, tmp_path, "op-a", health=free_port(), metrics=free_port())
    try:
        for i in range(20):
            doc = example()
            doc["metadata"]["name"] = f"r{i}"
            await harness.create_run(doc)

        async def all_jobs():
            return len(await harness.list("jobs")) == 20

        await harness.wait(all_jobs, "20 runs' Jobs", timeout=120)
        for i in range(20):
            await harness.set_status("jobs", f"r{i}-sft", {"active": 1, "ready": 1})
        await asyncio.sleep(2)  # their loops wake up and reconcile
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        rc = await asyncio.wait_for(proc.wait(), 30)
        exited = time.monotonic() - signalled
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        log.close()
    print(f"exit: rc {rc} {exited:.2f} s after SIGTERM with 20 runs")
    # 2 s is the target (1.1 s measured at load 15-19); a loaded CI machine stretched a like exit to 5.5 s, so the
    # bound sits just inside --shutdown-timeout (10 s, exit 75): a blocking call in the stop path (a 30 s watch, a
    # join) still fails it, and the test does not hang on a timing.
    assert rc == 0 and exited < 8.0, (rc, exited, (tmp_path / "op-a.log").read_text()[-3000:])
