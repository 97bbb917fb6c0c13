"""The kubelet emulator's Job controller: a failed pod is retried up to backoffLimit, and the operator's own
podFailurePolicy (FailJob on the config/data exit codes) fails the Job at the first such exit, with no retry; and a
pod's /tmp emptyDir holds Unix sockets however deep the emulator's work folder is."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from op_harness import NS

from rlt.contract.exitcodes import ExitCode
from rlt_operator.builders import pod_failure_policy
from rlt_sandbox.kubelet_emulator import LocalKubelet
from rlt_sandbox.kubelet_model import ImageEnv

PY = Path(sys.executable)
BACKOFF_LIMIT = 2
# Exits `code` the first `fails` times it runs (a count kept on the claim, as a real retry would find it).
SCRIPT = """
import pathlib, sys
n = pathlib.Path("/data/attempts"); n.parent.mkdir(parents=True, exist_ok=True)
k = int(n.read_text()) if n.exists() else 0
n.write_text(str(k + 1))
sys.exit(int(sys.argv[1]) if k < int(sys.argv[2]) else 0)
"""


def _job(name: str, code: int, fails: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": BACKOFF_LIMIT,
            "podFailurePolicy": pod_failure_policy(),  # the one the operator renders for trainer Jobs
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": name}}],
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "trainer:1",
                            "command": ["python", "-c", SCRIPT, str(code), str(fails)],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        }
                    ],
                },
            },
        },
    }


async def _finished(harness, name: str, timeout: float = 60) -> dict[str, Any]:
    async def done():
        job = await harness.get("jobs", name)
        conds = (job.get("status") or {}).get("conditions") or []
        return job if any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conds) else None

    return await harness.wait(done, f"Job {name} to finish", timeout=timeout)


def _condition(job: dict[str, Any]) -> dict[str, Any]:
    (cond,) = [c for c in job["status"]["conditions"] if c["status"] == "True" and c["type"] in ("Complete", "Failed")]
    return cond


def _real_job_status_problems(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What a real API server (1.31+) refuses in a Job status update (its Job status validation)."""
    out = []
    conds = {c["type"]: c["status"] for c in after.get("conditions") or []}
    if conds.get("Complete") == "True":
        if conds.get("SuccessCriteriaMet") != "True":
            out.append("cannot set Complete=True condition without the SuccessCriteriaMet=true condition")
        if not after.get("completionTime"):
            out.append("completionTime is required for Complete jobs")
    if conds.get("Failed") == "True" and conds.get("FailureTarget") != "True":
        out.append("cannot set Failed=True condition without the FailureTarget=true condition")
    if conds.get("Failed") == "True" and after.get("completionTime"):
        out.append("completionTime cannot be set for failed jobs")
    if before.get("startTime") and after.get("startTime") != before.get("startTime"):
        out.append("startTime: field is immutable")
    if not after.get("startTime"):
        out.append("startTime is required for a started Job")
    return out


@pytest.fixture
async def kubelet(harness, tmp_path):
    k = LocalKubelet(
        harness.url, tmp_path, default_image=ImageEnv(str(PY.parent)), poll_seconds=0.1, job_backoff_seconds=0.2
    )
    await k.start()
    try:
        yield k
    finally:
        await k.stop()


@pytest.mark.parametrize("code", [ExitCode.CONFIG_ERROR, ExitCode.DATA_ERROR])
async def test_fail_fast_exit_code_fails_the_job_at_once(harness, kubelet, code):
    await harness.create_workload("jobs", _job("ff", int(code), fails=99))
    job = await _finished(harness, "ff")
    cond = _condition(job)
    assert (cond["type"], cond["reason"]) == ("Failed", "PodFailurePolicy"), cond
    assert f"exit code {int(code)} matching FailJob rule at index 0" in cond["message"]
    assert job["status"]["failed"] == 1
    await asyncio.sleep(1.0)  # well past the retry back-off: no second pod comes
    pods = await harness.list("pods", "app=ff")
    assert len(pods) == 1 and (kubelet.claim_dir("ff") / "attempts").read_text() == "1"


async def test_other_exit_codes_are_retried_up_to_the_backoff_limit(harness, kubelet):
    await harness.create_workload("jobs", _job("flaky", 1, fails=99))
    job = await _finished(harness, "flaky")
    cond = _condition(job)
    assert (cond["type"], cond["reason"]) == ("Failed", "BackoffLimitExceeded"), cond
    pods = await harness.list("pods", "app=flaky")
    codes = [p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] for p in pods]
    # backoffLimit 2: the first run and two retries, all of index 0.
    assert codes == [1] * (BACKOFF_LIMIT + 1) and job["status"]["failed"] == BACKOFF_LIMIT + 1
    assert {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] for p in pods} == {"0"}


async def test_a_retry_that_succeeds_completes_the_job(harness, kubelet):
    await harness.create_workload("jobs", _job("retry", 1, fails=BACKOFF_LIMIT))
    started = await harness.wait(lambda: _started(harness, "retry"), "the Job's startTime", timeout=30)
    job = await _finished(harness, "retry")
    assert _condition(job)["type"] == "Complete", job["status"]
    assert (job["status"]["failed"], job["status"]["succeeded"]) == (BACKOFF_LIMIT, 1)
    assert _real_job_status_problems(started, job["status"]) == []


async def _started(harness, name):
    job = await harness.get("jobs", name)
    return (job.get("status") or {}).get("startTime") and job["status"]


async def test_job_status_is_written_as_the_real_job_controller_does(harness, kubelet):
    """Complete with SuccessCriteriaMet and completionTime, Failed with FailureTarget, startTime set once: a real
    API server refuses any other Job status (the emulator must not teach a status a cluster would reject)."""
    await harness.create_workload("jobs", _job("ok", 0, fails=0))
    await harness.create_workload("jobs", _job("bad", int(ExitCode.CONFIG_ERROR), fails=99))
    for name in ("ok", "bad"):
        started = await harness.wait(lambda n=name: _started(harness, n), f"{name} startTime", timeout=30)
        done = await _finished(harness, name)
        assert _real_job_status_problems(started, done["status"]) == [], done["status"]


async def test_list_items_without_apiversion_and_kind_make_pods(harness, kubelet):
    """A real API server's LIST items carry no apiVersion/kind: the pod's owner reference comes from the kind table."""
    job = _job("bare", 0, fails=0)
    created = await harness.create_workload("jobs", job)
    bare = {k: v for k, v in created.items() if k not in ("apiVersion", "kind")}
    await kubelet._create_pod(NS, "bare-0-abcde", "Job", bare, 0, hostname="bare-0")
    pod = await harness.get("pods", "bare-0-abcde")
    assert pod["metadata"]["ownerReferences"][0]["apiVersion"] == "batch/v1"


async def test_a_pod_binds_a_unix_socket_in_its_tmp_emptydir_under_a_deep_workdir(harness, tmp_path):
    """vLLM puts its ZMQ sockets in $TMPDIR: the /tmp emptyDir must map to a path a socket name fits in (107 bytes)."""
    script = (
        "import os, socket, uuid\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.bind(os.path.join(os.environ['TMPDIR'], str(uuid.uuid4())))\n"
    )
    job = _job("sock", 0, fails=0)
    pod = job["spec"]["template"]["spec"]
    pod["volumes"].append({"name": "tmp", "emptyDir": {}})
    container = pod["containers"][0]
    container["command"] = ["python", "-c", script]
    container["env"] = [{"name": "TMPDIR", "value": "/tmp"}]
    container["volumeMounts"].append({"name": "tmp", "mountPath": "/tmp"})
    await harness.create_workload("jobs", job)
    deep = tmp_path / ("d" * 60)  # with a pod folder's path, no room is left for a socket's name
    k = LocalKubelet(harness.url, deep, default_image=ImageEnv(str(PY.parent)), poll_seconds=0.1)
    await k.start()
    try:
        done = await _finished(harness, "sock")
        logs = [p.log_path.read_text()[-1500:] for p in k.pods.values()]
        assert _condition(done)["type"] == "Complete", logs[-1]
    finally:
        await k.stop()


async def test_a_new_pod_of_a_run_waits_for_its_leaving_pod_that_holds_the_runs_ports(harness, kubelet):
    """The pods of a run share its ports here (one loopback): a restarted gang's pod starts only once the deleted
    gang's pod has no process left (CI once saw the new rank 0 find the old rendezvous port taken). The old pod
    ignores SIGTERM and holds for its grace period, as a frozen survivor of a lost peer does."""
    import time

    from rlt_operator.builders.common import L_RUN
    from rlt_sandbox.kubelet_processes import tagged_processes

    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    old = _job("gang", 0, fails=0)
    old["spec"]["template"]["metadata"]["labels"][L_RUN] = "r1"
    # A grace long enough that the new pod is there to be held back on a busy machine (CI once took over 3 s from
    # the delete to the new pod's first start attempt, and the old process was gone by then).
    old["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 15
    old["spec"]["template"]["spec"]["containers"][0]["command"] = ["python", "-c", stubborn]
    await harness.create_workload("jobs", old)
    (first,) = await harness.wait(lambda: [p for p in kubelet.pods.values() if p.proc is not None], "the old pod")
    await harness.call("DELETE", f"/apis/batch/v1/namespaces/{NS}/jobs/gang")
    await harness.wait(lambda: first.terminating, "the old pod terminating")
    new = _job("gang-2", 0, fails=0)
    new["spec"]["template"]["metadata"]["labels"][L_RUN] = "r1"
    new["spec"]["template"]["spec"]["containers"][0]["command"] = ["python", "-c", "import time; time.sleep(30)"]
    await harness.create_workload("jobs", new)
    (second,) = await harness.wait(lambda: [p for p in kubelet.pods.values() if p.owner == "gang-2"], "the new pod")
    waited = await harness.wait(lambda: second.waiting, "the new pod held back")
    assert waited.reason == "ContainerCreating" and first.name in waited.message
    assert second.proc is None and tagged_processes(first.tag)  # held while the old process lives
    await harness.wait(lambda: second.proc is not None, "the new pod started", timeout=60)
    assert not tagged_processes(first.tag), "started while the old gang's process still held the run's ports"
    assert time.monotonic() >= first.kill_at
