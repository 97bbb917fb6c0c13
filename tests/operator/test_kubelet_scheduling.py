"""The kubelet emulator's scheduler checks and what `rlt sandbox --run-pods` says of its pods (issue 53): a pod whose
claim does not exist stays Pending with the scheduler's FailedScheduling Event, as on a cluster (a run's
`existingClaim` that is missing must not quietly get a fresh folder), and a pod whose image cannot be pulled is
never announced as started."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from op_harness import NS, PATHS, example

from rlt_sandbox.kubelet_emulator import LocalKubelet
from rlt_sandbox.kubelet_model import ImageEnv, PodRun, PodWaiting
from rlt_sandbox.sandbox_pods import pod_state

PY = Path(sys.executable)
pytestmark = pytest.mark.timeout(120)


def _job(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "trainer:1",
                            "command": ["python", "-c", "import pathlib; pathlib.Path('/data/ran').write_text('1')"],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        }
                    ],
                },
            },
        },
    }


async def test_a_pod_whose_claim_does_not_exist_stays_pending_until_the_claim_is_created(harness, tmp_path):
    await harness.call("POST", PATHS["jobs"].format(ns=NS), _job("t-claim", "shared-data"))
    kubelet = LocalKubelet(harness.url, tmp_path, default_image=ImageEnv(str(PY.parent)), poll_seconds=0.1)
    await kubelet.start()
    try:

        async def unschedulable():
            pods = await harness.list("pods", "app=t-claim")
            conds = [c for p in pods for c in (p.get("status") or {}).get("conditions") or []]
            return pods[0] if any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conds) else None

        pod = await harness.wait(unschedulable, "the pod Unschedulable", timeout=30)
        name, status = pod["metadata"]["name"], pod["status"]
        (cond,) = status["conditions"]
        assert status["phase"] == "Pending" and cond["reason"] == "Unschedulable", status
        assert 'persistentvolumeclaim "shared-data" not found' in cond["message"], cond
        assert "containerStatuses" not in status  # no node, so no container was ever created
        events = await harness.wait(lambda: harness.events(name), "the scheduler's Event", timeout=20)
        assert [(e["reason"], e["type"], e["source"]["component"]) for e in events] == [
            ("FailedScheduling", "Warning", "default-scheduler")
        ]
        assert events[0]["message"] == cond["message"] and events[0]["involvedObject"]["kind"] == "Pod"
        assert not kubelet.claim_dir("shared-data").joinpath("ran").exists()

        pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "shared-data"}}
        await harness.call("POST", PATHS["persistentvolumeclaims"].format(ns=NS), pvc)

        async def succeeded():
            job = await harness.get("jobs", "t-claim")
            return job if (job.get("status") or {}).get("succeeded") == 1 else None

        await harness.wait(succeeded, "the Job to run once its claim exists", timeout=60)
        assert kubelet.claim_dir("shared-data").joinpath("ran").read_text() == "1"
        assert len(await harness.events(name)) == 1  # said once, not once per retry
    finally:
        await kubelet.stop()


def _pod(tmp_path: Path) -> PodRun:
    container = {"name": "main", "image": "ghcr.io/example/trainer:missing"}
    return PodRun(
        name="p",
        owner_kind="Job",
        owner="j",
        index=0,
        restart_policy="Never",
        body={},
        dir=tmp_path,
        log_path=tmp_path / "container.log",
        container=container,
    )


def test_a_pod_is_announced_as_started_only_once_a_container_runs(tmp_path):
    pod = _pod(tmp_path)
    assert pod_state(pod) is None  # created, nothing started yet
    lines = set()
    for reason in ("ErrImagePull", "ImagePullBackOff", "ErrImagePull"):  # the kubelet's pull retries
        pod.waiting = PodWaiting(reason, "rpc error")
        lines.add(pod_state(pod))
    assert lines == {
        "not started, ErrImagePull/ImagePullBackOff: image 'ghcr.io/example/trainer:missing' cannot be pulled"
    }
    pod.waiting = PodWaiting("Unschedulable", 'persistentvolumeclaim "x" not found')
    assert pod_state(pod) == 'not started, Unschedulable: persistentvolumeclaim "x" not found'
    pod.waiting, pod.proc = None, object()  # type: ignore[assignment]  # its container's process
    assert pod_state(pod) == "started"
    pod.phase = "Failed"
    assert pod_state(pod) == "Failed"


async def test_a_runs_missing_existing_claim_keeps_its_pod_pending_as_on_a_cluster(harness, tmp_path):
    """The operator renders the run on the user's claim and creates none; the sandbox's scheduler refuses to place
    its pod (it used to make a fresh folder and train)."""
    from pods_harness import running_pods

    await harness.start_operator()
    await harness.create_run(example(**{"spec.storage": {"existingClaim": "shared-data"}}))
    await harness.wait_object("jobs", "tiny-sft")
    async with running_pods(harness, tmp_path) as kubelet:

        async def unschedulable():
            pods = await harness.list("pods", "rlt.dev/run=tiny")
            conds = [c for p in pods for c in (p.get("status") or {}).get("conditions") or []]
            return [c for c in conds if c["type"] == "PodScheduled" and c["status"] == "False"]

        (cond,) = await harness.wait(unschedulable, "the run's pod Unschedulable", timeout=30)
        assert 'persistentvolumeclaim "shared-data" not found' in cond["message"]
        assert (
            not kubelet.claim_dir("shared-data").exists() and (await harness.run_status("tiny"))["phase"] == "Pending"
        )
