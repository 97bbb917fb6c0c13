"""The kubelet emulator on its own: a Job and a StatefulSet as the API holds them become real local processes, and
their exit codes, restarts and readiness come back as pod, Job and StatefulSet status."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest
from op_harness import NS, PATHS
from suite_helpers import free_port

from rlt_sandbox.kubelet_emulator import LocalKubelet
from rlt_sandbox.kubelet_model import ImageEnv, expand

PY = Path(sys.executable)


def test_expand_follows_kubernetes_rules():
    env = {"A": "x", "B": "$(A)y"}
    assert expand("$(A)-$(B)-$(C)-$$(A)", env) == "x-$(A)y-$(C)-$(A)"


def _job(name: str, script: str, completions: int = 2, env: list | None = None) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"rlt.dev/run": "t"}},
        "spec": {
            "completionMode": "Indexed",
            "completions": completions,
            "parallelism": completions,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"rlt.dev/run": "t", "app": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "volumes": [
                        {"name": "config", "configMap": {"name": "cfg"}},
                        {"name": "data", "persistentVolumeClaim": {"claimName": "claim"}},
                    ],
                    "containers": [
                        {
                            "name": "main",
                            "image": "trainer:1",
                            "command": ["python", "-c", script, "$(MASTER_ADDR)", "/data/out"],
                            "env": env or [],
                            "volumeMounts": [
                                {"name": "config", "mountPath": "/etc/rlt"},
                                {"name": "data", "mountPath": "/data"},
                            ],
                        }
                    ],
                },
            },
        },
    }


async def test_job_pods_run_as_rendered_and_report_back(harness, tmp_path):
    await harness.call(
        "POST",
        PATHS["configmaps"].format(ns=NS),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cfg"},
            "data": {"run.yaml": "url: http://gen.default.svc:8000\n"},
        },
    )
    script = (
        "import os, sys, pathlib, time\n"
        "idx = os.environ['NODE_RANK']\n"
        "out = pathlib.Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)\n"
        "(out / idx).write_text(sys.argv[1] + ' ' + pathlib.Path('/etc/rlt/run.yaml').read_text())\n"
        "time.sleep(1.0 if idx == '1' else 0)\n"
        "sys.exit(3 if idx == '1' else 0)\n"
    )
    env = [
        {"name": "MASTER_ADDR", "value": "t-sft-0.t-sft.default.svc"},
        {
            "name": "NODE_RANK",
            "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
            },
        },
    ]
    await harness.create_workload("jobs", _job("t-sft", script, env=env))
    kubelet = LocalKubelet(harness.url, tmp_path, default_image=ImageEnv(str(PY.parent)), poll_seconds=0.1)
    await kubelet.start()
    try:

        async def failed():
            job = await harness.get("jobs", "t-sft")
            return job if any(c["type"] == "Failed" for c in (job.get("status") or {}).get("conditions", [])) else None

        job = await harness.wait(failed, "the Job to fail (index 1 exits 3)", timeout=30)
        assert job["status"]["failed"] == 1 and job["status"]["succeeded"] == 1
        pods = {
            p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p
            for p in await harness.list("pods", "app=t-sft")
        }
        assert pods["0"]["status"]["phase"] == "Succeeded"
        assert pods["1"]["status"]["phase"] == "Failed"
        assert pods["1"]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
        claim = kubelet.claim_dir("claim") / "out"
        # MASTER_ADDR and the Service name in the mounted ConfigMap point at loopback; /data is the claim's folder.
        assert (claim / "0").read_text() == "127.0.0.1 url: http://127.0.0.1:8000\n"
        assert (claim / "1").exists()
    finally:
        await kubelet.stop()


async def test_killed_pod_fails_its_job_and_a_deleted_job_takes_its_pods(harness, tmp_path):
    await harness.call(
        "POST",
        PATHS["configmaps"].format(ns=NS),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {}},
    )
    await harness.create_workload("jobs", _job("t-rl", "import time; time.sleep(600)"))
    kubelet = LocalKubelet(
        harness.url, tmp_path, default_image=ImageEnv(str(PY.parent)), poll_seconds=0.1, grace_seconds=1.0
    )
    await kubelet.start()
    try:
        await harness.wait(
            lambda: len(kubelet.pods) == 2 and all(p.phase == "Running" for p in kubelet.pods.values()),
            "two running pods",
            timeout=20,
        )
        victim = kubelet.pod("t-rl-1-")
        kubelet.kill(victim.name)

        async def failed():
            job = await harness.get("jobs", "t-rl")
            return any(c["type"] == "Failed" for c in (job.get("status") or {}).get("conditions", []))

        await harness.wait(failed, "the Job to fail after a pod was killed", timeout=20)
        assert victim.exit_code == -9
        survivor = kubelet.pod("t-rl-0-")
        # The Job controller ends the other pods of a failed Job.
        await harness.wait(lambda: survivor.proc.poll() is not None, "the other pod to be terminated", timeout=20)
        await harness.call("DELETE", f"{PATHS['jobs'].format(ns=NS)}/t-rl")
        await harness.wait(lambda: not kubelet.pods, "pods of the deleted Job to go", timeout=20)
        assert await harness.list("pods", "app=t-rl") == []
    finally:
        await kubelet.stop()


async def test_a_failed_pod_handed_to_the_run_outlives_its_job_until_deleted_through_the_api(harness, tmp_path):
    """The operator keeps a failed gang's pod for its logs by making the run its owner before it deletes the Job
    (gang.kept_pod_patch). The garbage collector reads a pod's current owners: the emulator must not delete it with
    the Job, and must let it go once it is deleted through the API (the run's cleanup)."""
    from rlt_operator.builders import RunRef
    from rlt_operator.status.gang import kept_pod_patch

    await harness.call(
        "POST",
        PATHS["configmaps"].format(ns=NS),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {}},
    )
    await harness.create_workload("jobs", _job("t-rl", "raise SystemExit(3)", completions=1))
    kubelet = LocalKubelet(
        harness.url, tmp_path, default_image=ImageEnv(str(PY.parent)), poll_seconds=0.1, grace_seconds=1.0
    )
    await kubelet.start()
    try:
        await harness.wait(
            lambda: any(p.exit_code == 3 for p in kubelet.pods.values()), "the pod to fail with 3", timeout=20
        )
        (failed,) = kubelet.pods.values()
        patch = kept_pod_patch(RunRef(name="t", namespace=NS, uid="run-uid"), [])
        await harness.call(
            "PATCH", f"{PATHS['pods'].format(ns=NS)}/{failed.name}", patch, "application/merge-patch+json"
        )
        await harness.call("DELETE", f"{PATHS['jobs'].format(ns=NS)}/t-rl")
        await asyncio.sleep(2)  # twenty passes of the emulator
        (kept,) = await harness.list("pods", "app=t-rl")
        assert kept["metadata"]["name"] == failed.name
        assert [r["uid"] for r in kept["metadata"]["ownerReferences"]] == ["run-uid"]
        assert list(kubelet.pods.values()) == [failed]
        await harness.call("DELETE", f"{PATHS['pods'].format(ns=NS)}/{failed.name}")
        await harness.wait(lambda: not kubelet.pods, "the deleted pod to be forgotten", timeout=20)
    finally:
        await kubelet.stop()


async def test_a_deleted_jobs_pod_gets_its_own_grace_period(harness, tmp_path):
    """SIGTERM first, SIGKILL `terminationGracePeriodSeconds` later (the pod's own, as a kubelet does): a pod that
    ignores SIGTERM lives on for its 2 s, no more, no less."""
    await harness.call(
        "POST",
        PATHS["configmaps"].format(ns=NS),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {}},
    )
    script = (
        "import pathlib, signal, sys, time\n"
        "out = pathlib.Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)\n"
        "signal.signal(signal.SIGTERM, lambda *_: (out / 'term').write_text('1'))  # heard, and carried on\n"
        "(out / 'up').write_text('1')\n"
        "while True: time.sleep(0.05)\n"
    )
    job = _job("t-grace", script, completions=1)
    job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 2
    await harness.create_workload("jobs", job)
    kubelet = LocalKubelet(harness.url, tmp_path, default_image=ImageEnv(str(PY.parent)), poll_seconds=0.1)
    await kubelet.start()
    try:
        out = kubelet.claim_dir("claim") / "out"
        await harness.wait((out / "up").exists, "the pod to start", timeout=20)
        pod = kubelet.pod("t-grace-0-")
        deleted = time.monotonic()  # before the request: the kubelet cannot see the deletion earlier
        await harness.call("DELETE", f"{PATHS['jobs'].format(ns=NS)}/t-grace")
        await harness.wait(lambda: pod.proc.poll() is not None, "the pod's process to end", timeout=30)
        lived = time.monotonic() - deleted
        assert (out / "term").exists(), "SIGTERM came first"
        assert pod.proc.returncode == -9
        # Not before its 2 s; and its own period, not the 30 s default (the margin is for a loaded machine)
        assert 2.0 <= lived < 20, f"killed {lived:.1f} s after the deletion; its grace period is 2 s"
        await harness.wait(lambda: not kubelet.pods, "the pod to go", timeout=10)
    finally:
        await kubelet.stop()


async def test_a_pod_deleted_with_a_grace_period_gets_that_period_and_stays_until_its_processes_end(harness, tmp_path):
    """A DELETE with gracePeriodSeconds (the operator's, for the live pods of a gang that lost a peer) replaces the
    pod's own 600 s, also after its Job's deletion gave it those 600 s: SIGKILL 1 s later. Meanwhile the pod stays
    in the API, marked (deletionTimestamp), as on a real API server; the kubelet deletes it once its processes end."""
    await harness.call(
        "POST",
        PATHS["configmaps"].format(ns=NS),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {}},
    )
    script = (
        "import pathlib, signal, sys, time\n"
        "out = pathlib.Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)\n"
        "signal.signal(signal.SIGTERM, lambda *_: (out / 'term').write_text('1'))  # heard, and carried on\n"
        "(out / 'up').write_text('1')\n"
        "while True: time.sleep(0.05)\n"
    )
    job = _job("t-short", script, completions=1)
    job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 600
    await harness.create_workload("jobs", job)  # with its claim: no pod starts whose claim is missing
    kubelet = LocalKubelet(harness.url, tmp_path, default_image=ImageEnv(str(PY.parent)), poll_seconds=0.1)
    await kubelet.start()
    try:
        out = kubelet.claim_dir("claim") / "out"
        await harness.wait((out / "up").exists, "the pod to start", timeout=120)  # a Python start on a loaded core
        pod = kubelet.pod("t-short-0-")
        pods = PATHS["pods"].format(ns=NS)

        async def running():
            return ((await harness.get("pods", pod.name)) or {}).get("status", {}).get("phase") == "Running"

        await harness.wait(running, "the pod to be Running in the API", timeout=60)
        await harness.call("DELETE", f"{PATHS['jobs'].format(ns=NS)}/t-short", {"propagationPolicy": "Foreground"})
        await harness.wait((out / "term").exists, "SIGTERM of the Job's deletion", timeout=60)
        marked = await harness.call("DELETE", f"{pods}/{pod.name}", {"gracePeriodSeconds": 1})
        deleted = time.monotonic()
        assert marked["metadata"]["deletionGracePeriodSeconds"] == 1 and marked["metadata"]["deletionTimestamp"]
        assert ((await harness.get("pods", pod.name)) or {}).get("metadata", {}).get("deletionTimestamp"), "it stays"
        await harness.wait(lambda: pod.proc.poll() is not None, "the pod's process to end", timeout=60)
        lived = time.monotonic() - deleted
        assert pod.proc.returncode == -9
        assert lived < 30, f"killed {lived:.1f} s after a deletion with a 1 s grace period (its own: 600 s)"
        await harness.wait_gone("pods", pod.name, timeout=60)
    finally:
        await kubelet.stop()


async def test_statefulset_pod_restarts_and_becomes_ready(harness, tmp_path):
    port = free_port()
    server = f"import http.server as h; h.HTTPServer(('127.0.0.1', {port}), h.SimpleHTTPRequestHandler).serve_forever()"
    await harness.call(
        "POST",
        PATHS["statefulsets"].format(ns=NS),
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "t-generator"},
            "spec": {
                "replicas": 1,
                "serviceName": "t-generator",
                "selector": {"matchLabels": {"app": "g"}},
                "template": {
                    "metadata": {"labels": {"app": "g", "rlt.dev/run": "t"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "vllm",
                                "image": "generator:1",
                                "command": ["python3", "-c", server],
                                "readinessProbe": {"httpGet": {"path": "/", "port": port}},
                            }
                        ]
                    },
                },
            },
        },
    )
    kubelet = LocalKubelet(harness.url, tmp_path, images={"generator:1": ImageEnv(str(PY.parent))}, poll_seconds=0.1)
    await kubelet.start()
    try:

        async def ready():
            sts = await harness.get("statefulsets", "t-generator")
            return (sts.get("status") or {}).get("readyReplicas") == 1

        await harness.wait(ready, "the server to answer its readiness probe", timeout=30)
        kubelet.kill("t-generator-0")

        async def restarted():
            pod = await harness.get("pods", "t-generator-0")
            return pod["status"]["containerStatuses"][0]["restartCount"] == 1

        await harness.wait(restarted, "restartPolicy Always to restart the container", timeout=30)
        await harness.wait(ready, "ready again", timeout=30)
    finally:
        await kubelet.stop()


@pytest.mark.parametrize("image", ["unknown:1"])
async def test_an_image_without_stand_in_fails_the_pod_with_a_reason(harness, tmp_path, image):
    job = _job("t-x", "pass", completions=1)
    job["spec"]["template"]["spec"]["containers"][0]["image"] = image
    await harness.call(
        "POST",
        PATHS["configmaps"].format(ns=NS),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {}},
    )
    await harness.create_workload("jobs", job)
    kubelet = LocalKubelet(harness.url, tmp_path, images={}, poll_seconds=0.1)
    await kubelet.start()
    try:

        async def pod_failed():
            pods = await harness.list("pods", "app=t-x")
            return pods and pods[0]["status"]["phase"] == "Failed" and pods[0]["status"].get("message")

        message = await harness.wait(pod_failed, "the pod to fail", timeout=20)
        assert "unknown:1" in message
    finally:
        await kubelet.stop()


_NAMED_SERVER = (
    "import http.server as h, sys\n"
    "class H(h.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(sys.argv[2].encode())\n"
    "h.HTTPServer(('0.0.0.0', int(sys.argv[1])), H).serve_forever()\n"
)


async def test_two_runs_binding_the_same_rendered_port_each_get_their_own(harness, tmp_path):
    """On a cluster two runs' pods bind the same port on their own IPs; here they share loopback, so each run gets
    its own port (the env value, the declared port and the probe are rewritten) and the proxy reaches each."""
    import urllib.request

    port = free_port()
    for run in ("ra", "rb"):
        await harness.call(
            "POST",
            PATHS["statefulsets"].format(ns=NS),
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": f"{run}-server"},
                "spec": {
                    "replicas": 1,
                    "serviceName": f"{run}-server",
                    "selector": {"matchLabels": {"app": run}},
                    "template": {
                        "metadata": {"labels": {"app": run, "rlt.dev/run": run}},
                        "spec": {
                            "containers": [
                                {
                                    "name": "server",
                                    "image": "generator:1",
                                    "command": ["python3", "-c", _NAMED_SERVER, "$(SERVE_PORT)", run],
                                    "env": [{"name": "SERVE_PORT", "value": str(port)}],
                                    "ports": [{"name": "http", "containerPort": port}],
                                    "readinessProbe": {"httpGet": {"path": "/", "port": port}},
                                }
                            ]
                        },
                    },
                },
            },
        )
    kubelet = LocalKubelet(harness.url, tmp_path, images={"generator:1": ImageEnv(str(PY.parent))}, poll_seconds=0.1)
    await kubelet.start()
    try:

        async def both_ready():
            sets = [await harness.get("statefulsets", f"{run}-server") for run in ("ra", "rb")]
            return all((s.get("status") or {}).get("readyReplicas") == 1 for s in sets)

        await harness.wait(both_ready, "both servers to answer their readiness probes", timeout=30)
        first, second = kubelet.ports_of(NS, "ra")[port], kubelet.ports_of(NS, "rb")[port]
        assert first == port and second != port  # the first keeps the rendered port, the second gets a free one
        template = kubelet.proxy_url()
        for run in ("ra", "rb"):
            url = template.format(namespace=NS, run=run, port=port) + "/"
            body = await asyncio.to_thread(lambda u=url: urllib.request.urlopen(u, timeout=5).read().decode())
            assert body == run
    finally:
        await kubelet.stop()


async def test_a_namespace_created_later_gets_its_pods(harness, tmp_path):
    """`rlt sandbox --run-pods` follows the API's namespaces: a run applied in a namespace created after the start
    runs (it used to be only the namespaces named at start, and `--namespace` dropped `default`)."""
    kubelet = LocalKubelet(
        harness.url, tmp_path, default_image=ImageEnv(str(PY.parent)), poll_seconds=0.1, follow_namespaces=True
    )
    await kubelet.start()
    try:
        await harness.call(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "late"}}
        )
        late = PATHS["configmaps"].format(ns="late")
        await harness.call(
            "POST", late, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {}}
        )
        await harness.create_workload("jobs", ns="late", body=_job("t-late", "import sys; sys.exit(0)", 1))

        async def done():
            job = await harness.call("GET", f"{PATHS['jobs'].format(ns='late')}/t-late")
            return job if (job.get("status") or {}).get("succeeded") == 1 else None

        await harness.wait(done, "the Job in namespace late to succeed", timeout=30)
        assert "late" in kubelet.namespaces and "default" in kubelet.namespaces
    finally:
        await kubelet.stop()


async def test_a_missing_secret_or_an_unmatched_node_selector_keeps_the_pod_pending_with_a_reason(harness, tmp_path):
    """As a kubelet and a scheduler report them (not a failed pod): the operator reads the same reasons as on a
    cluster; creating the Secret lets the pod start."""
    from rlt_operator.status.observed import summarize

    await harness.call(
        "POST",
        PATHS["configmaps"].format(ns=NS),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {}},
    )
    secret_env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]
    await harness.create_workload("jobs", _job("t-secret", "import sys; sys.exit(0)", 1, secret_env))
    pinned = _job("t-pinned", "import sys; sys.exit(0)", 1)
    pinned["spec"]["template"]["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "H100"}
    await harness.create_workload("jobs", pinned)
    kubelet = LocalKubelet(harness.url, tmp_path, default_image=ImageEnv(str(PY.parent)), poll_seconds=0.1)
    await kubelet.start()
    try:

        async def problem(app: str, reason: str):
            pods = await harness.list("pods", f"app={app}")
            found = [summarize("pods", p)["problem"] for p in pods]
            return pods[0] if found and found[0] and found[0]["reason"] == reason else None

        pod = await harness.wait(lambda: problem("t-secret", "CreateContainerConfigError"), "config error", timeout=20)
        assert pod["status"]["phase"] == "Pending" and 'secret "hf" not found' in str(pod["status"])
        pod = await harness.wait(lambda: problem("t-pinned", "Unschedulable"), "unschedulable", timeout=20)
        assert pod["status"]["phase"] == "Pending" and "didn't match Pod's node affinity/selector" in str(pod["status"])

        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf"}, "data": {"token": "eA=="}}
        await harness.call("POST", f"/api/v1/namespaces/{NS}/secrets", secret)

        async def succeeded():
            job = await harness.get("jobs", "t-secret")
            return job if (job.get("status") or {}).get("succeeded") == 1 else None

        await harness.wait(succeeded, "the Job to run once its Secret exists", timeout=30)
        assert (await harness.get("jobs", "t-pinned")).get("status", {}).get("failed", 0) == 0
    finally:
        await kubelet.stop()


async def test_init_containers_run_in_order_before_the_main_one_and_a_failed_one_restarts_or_fails_the_pod(
    harness, tmp_path
):
    """Each init container runs to its end, in order, before the main container; its termination message is the file
    at its terminationMessagePath. Under restartPolicy Never a failing one fails the pod (Init:Error, the main
    container never starts); under Always it runs again (restartCount) until it succeeds."""
    from rlt_sandbox.kmock_tables import pod_status_text

    await harness.call(
        "POST",
        PATHS["configmaps"].format(ns=NS),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {}},
    )
    order = "import sys, pathlib; p = pathlib.Path(sys.argv[1]); p.mkdir(parents=True, exist_ok=True); "
    first = order + "(p / 'a').touch(); pathlib.Path('/dev/termination-log').write_text('a says hi')"
    second = order + "assert (p / 'a').exists(); (p / 'b').touch()"
    ok = _job("t-init", "import pathlib, sys; assert pathlib.Path('/data/out/b').exists()", completions=1)
    spec = ok["spec"]["template"]["spec"]
    spec["initContainers"] = [
        {
            "name": name,
            "image": "trainer:1",
            "command": ["python", "-c", script, "/data/out"],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        }
        for name, script in (("first", first), ("second", second))
    ]
    await harness.create_workload("jobs", ok)
    bad = _job("t-badinit", "pass", completions=1)
    bad["spec"]["template"]["spec"]["initContainers"] = [
        {"name": "check", "image": "trainer:1", "command": ["python", "-c", "import sys; print('no'); sys.exit(78)"]}
    ]
    await harness.create_workload("jobs", bad)
    flaky = "import pathlib, sys; m = pathlib.Path(sys.argv[1]) / 'tried'; done = m.exists(); m.touch(); "
    flaky += "sys.exit(0 if done else 3)"
    await harness.call(
        "POST",
        PATHS["statefulsets"].format(ns=NS),
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "t-flaky"},
            "spec": {
                "replicas": 1,
                "serviceName": "t-flaky",
                "selector": {"matchLabels": {"app": "f"}},
                "template": {
                    "metadata": {"labels": {"app": "f", "rlt.dev/run": "f"}},
                    "spec": {
                        "volumes": [{"name": "scratch", "emptyDir": {}}],
                        "initContainers": [
                            {
                                "name": "wait",
                                "image": "trainer:1",
                                "command": ["python", "-c", flaky, "/scratch"],
                                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                            }
                        ],
                        "containers": [{"name": "main", "image": "trainer:1", "command": ["python", "-c", "input()"]}],
                    },
                },
            },
        },
    )
    kubelet = LocalKubelet(harness.url, tmp_path, default_image=ImageEnv(str(PY.parent)), poll_seconds=0.1)
    await kubelet.start()
    try:

        async def job_done(name: str, key: str):
            job = await harness.get("jobs", name)
            return job if (job.get("status") or {}).get(key) == 1 else None

        await harness.wait(lambda: job_done("t-init", "succeeded"), "the Job with init containers to succeed", 60)
        (pod,) = await harness.list("pods", "app=t-init")
        inits = pod["status"]["initContainerStatuses"]
        assert [c["name"] for c in inits] == ["first", "second"]
        assert [c["state"]["terminated"]["exitCode"] for c in inits] == [0, 0]
        assert (
            inits[0]["state"]["terminated"]["message"] == "a says hi"
            and "message" not in inits[1]["state"]["terminated"]
        )

        await harness.wait(lambda: job_done("t-badinit", "failed"), "the Job whose init container fails to fail", 60)
        (pod,) = await harness.list("pods", "app=t-badinit")
        assert pod["status"]["phase"] == "Failed" and pod_status_text(pod) == "Init:Error"
        (check,) = pod["status"]["initContainerStatuses"]
        assert check["state"]["terminated"]["exitCode"] == 78
        assert pod["status"]["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
        assert not kubelet.pod("t-badinit").log_path.exists(), "the main container must never start"

        async def flaky_running():
            pod = await harness.get("pods", "t-flaky-0")
            return pod if pod and (pod.get("status") or {}).get("phase") == "Running" else None

        pod = await harness.wait(flaky_running, "the StatefulSet pod to run after its init container's retry", 60)
        (wait,) = pod["status"]["initContainerStatuses"]
        assert wait["restartCount"] == 1 and wait["state"]["terminated"]["exitCode"] == 0
    finally:
        await kubelet.stop()


async def test_image_pulls_invalid_names_and_missing_images_keep_the_pod_pending(harness, tmp_path):
    """As a kubelet reports them: InvalidImageName for a reference that does not parse; ErrImagePull, then
    ImagePullBackOff, for an image the sandbox is told is missing (and again after the back-off)."""
    from rlt_operator.status.observed import summarize

    await harness.call(
        "POST",
        PATHS["configmaps"].format(ns=NS),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {}},
    )
    for name, image in (("t-invalid", "ghcr.io/Example/Trainer:1"), ("t-missing", "ghcr.io/example/trainer:nope")):
        job = _job(name, "pass", completions=1)
        job["spec"]["template"]["spec"]["containers"][0]["image"] = image
        await harness.create_workload("jobs", job)
    kubelet = LocalKubelet(
        harness.url,
        tmp_path,
        default_image=ImageEnv(str(PY.parent)),
        poll_seconds=0.1,
        missing_images=["*:nope"],
        image_backoff_seconds=2.0,
    )
    await kubelet.start()
    try:
        reasons: list[str] = []

        async def seen(app: str, reason: str):
            pods = await harness.list("pods", f"app={app}")
            problem = summarize("pods", pods[0])["problem"] if pods else None
            if problem and (not reasons or reasons[-1] != problem["reason"]) and app == "t-missing":
                reasons.append(problem["reason"])
            return pods[0] if problem and problem["reason"] == reason else None

        pod = await harness.wait(lambda: seen("t-invalid", "InvalidImageName"), "InvalidImageName", timeout=20)
        assert "invalid reference format" in str(pod["status"]) and pod["status"]["phase"] == "Pending"
        pod = await harness.wait(lambda: seen("t-missing", "ErrImagePull"), "ErrImagePull", timeout=20)
        assert 'failed to pull and unpack image "ghcr.io/example/trainer:nope"' in str(pod["status"])
        await harness.wait(lambda: seen("t-missing", "ImagePullBackOff"), "ImagePullBackOff", timeout=20)

        async def pulled_again():
            await seen("t-missing", "")
            return len(reasons) >= 3

        await harness.wait(pulled_again, "a second pull after the back-off", timeout=20)
        assert reasons[:3] == ["ErrImagePull", "ImagePullBackOff", "ErrImagePull"]
        assert pod["status"]["phase"] == "Pending" and not kubelet.pod("t-missing").log_path.exists()
    finally:
        await kubelet.stop()
