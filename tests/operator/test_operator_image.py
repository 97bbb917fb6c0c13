"""The operator IMAGE reconciles an RLTRun: built here with buildah (hack/images.py, cached by its inputs), started
the way the chart's Deployment starts it, against the emulated API.

From the rendered chart it takes the container's command, args and env, the pod's uid/gid, readOnlyRootFilesystem
and the /tmp emptyDir; from the image its Env and PATH. The process runs in the unpacked rootfs under chroot, in
its own mount namespace, on the host network. Only the two ports are remapped to free ones (the host network is
shared with other tests); tests/chart/test_image_contract.py checks the chart's ports against the image's EXPOSE.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from op_harness import example
from suite_helpers import PYPROJECT_VERSION, ROOT, find_tool, free_port

from rlt_operator.config.kinds import CLUSTER_PEERING

_spec = importlib.util.spec_from_file_location("rlt_images", ROOT / "hack" / "images.py")
images = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(images)
HELM = find_tool("helm")
# The operator exits this soon after SIGTERM (the chart's terminationGracePeriodSeconds is longer).
EXIT_BOUND = 10.0

pytestmark = [
    pytest.mark.timeout(900),  # a fresh machine bootstraps the base and builds the image first (about 5 min)
    pytest.mark.skipif(
        bool(images.tools_missing()), reason=f"needs {images.tools_missing()} (make test installs them)"
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting the image's rootfs needs root"),
    pytest.mark.skipif(HELM is None, reason="helm not installed (make tools)"),
]


def chart_docs() -> list[dict]:
    # The chart refuses its placeholder repository: name one, as a user installing the built image would.
    out = subprocess.run(
        [
            HELM,
            "template",
            "rlt",
            str(ROOT / "charts" / "rlt-operator"),
            "--namespace",
            "rlt-system",
            "--set",
            "image.repository=registry.example.com/rlt/rlt-operator",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def tail(log, n: int = 3000) -> str:
    log.flush()
    log.seek(0)
    return log.read()[-n:]


def proc_status(pid: int) -> dict[str, str]:
    return dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)


@pytest.fixture(scope="module")
def operator_image() -> Path:
    return images.rootfs("operator")


async def test_operator_image_reconciles_a_run(operator_image, harness, tmp_path):
    docs = chart_docs()
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "operator")
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    uid, gid = pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]
    image_user = json.loads((operator_image / "config.json").read_text())["User"]
    assert uid != 0 and images.parse_user(image_user, operator_image / "rootfs") == (uid, gid), image_user
    tmpfs = tuple(
        m["mountPath"]
        for m in container["volumeMounts"]
        if any(v["name"] == m["name"] and "emptyDir" in v for v in pod["volumes"])
    )
    assert tmpfs == ("/tmp",)

    metrics, health = free_port(), free_port()
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env.update(
        {
            "POD_NAMESPACE": "rlt-system",
            "RLT_OPERATOR_METRICS_PORT": str(metrics),
            "RLT_OPERATOR_HEALTH_PORT": str(health),
            "RLT_RESYNC_SECONDS": "2",
            # stands in for the service-account mount: the emulated API speaks plain HTTP
            "KUBECONFIG": "/mnt/kubeconfig",
        }
    )
    kube_dir = tmp_path / "kube"
    kube_dir.mkdir()
    (kube_dir / "kubeconfig").write_text((Path(os.environ["KUBECONFIG"])).read_text())
    kube_dir.chmod(0o755)
    (kube_dir / "kubeconfig").chmod(0o644)

    # The chart's peering object (its replicas peer there; without it `--peering` keeps the operator paused).
    for peering in [d for d in docs if d["apiVersion"] == CLUSTER_PEERING.api_version]:
        await harness.call("POST", CLUSTER_PEERING.collection_path(""), peering)
    watches = harness.count_watches()
    log = (tmp_path / "operator.log").open("w+")
    proc = images.run_rootfs(
        operator_image,
        container["command"] + container["args"],
        env=env,
        uid=uid,
        gid=gid,
        read_only=True,
        tmpfs=tmpfs,
        binds={str(kube_dir): "/mnt"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        await harness.wait(
            lambda: harness.count_watches() - watches >= 7 or proc.poll() is not None,
            "the operator's watches",
            timeout=60,
        )
        assert proc.poll() is None, f"operator exited:\n{tail(log)}"

        # It runs as the chart's non-root user, on a read-only root filesystem.
        op_pid = next(p for p in images.descendants(proc.pid) if b"operator" in Path(f"/proc/{p}/cmdline").read_bytes())
        st = proc_status(op_pid)
        assert st["Uid"].split()[:2] == [str(uid), str(uid)] and st["Gid"].split()[0] == str(gid), st["Uid"]
        root_mount = next(
            line.split()
            for line in Path(f"/proc/{op_pid}/mountinfo").read_text().splitlines()
            if line.split()[4] == "/"
        )
        assert "ro" in root_mount[5].split(","), root_mount

        # It reconciles: children created, status written.
        await harness.create_run(example())
        for plural, name in (
            ("configmaps", "tiny-config"),
            ("persistentvolumeclaims", "tiny-data"),
            ("services", "tiny-sft"),
            ("jobs", "tiny-sft"),
        ):
            await harness.wait_object(plural, name, timeout=30)
        await harness.trainer_running("tiny", "sft")
        status = await harness.wait_status("tiny", lambda s: s.get("phase") == "Running", "phase Running", timeout=30)
        assert status["stage"] == "sft"
        await harness.trainer_succeeded("tiny", "sft")
        await harness.wait_object("jobs", "tiny-rl", timeout=30)

        # /metrics and /healthz served from inside the image.
        def get(url: str) -> str:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.read().decode()

        body = get(f"http://127.0.0.1:{metrics}/metrics")
        assert "controller_runtime_reconcile_total" in body
        assert json.loads(get(f"http://127.0.0.1:{health}/healthz")).get("runs") == 1

        # `helm test`'s pod, in the image as the chart runs it, against this replica (not the Service's DNS name).
        check = next(d for d in docs if "helm.sh/hook" in (d["metadata"].get("annotations") or {}))["spec"]
        assert check["securityContext"]["runAsUser"] == uid
        command = check["containers"][0]["command"]
        probe = images.run_rootfs(
            operator_image,
            [*command[:-1], f"http://127.0.0.1:{metrics}/metrics"],
            uid=uid,
            gid=gid,
            read_only=True,
            tmpfs=(),  # the test pod mounts nothing
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        said = (await asyncio.to_thread(probe.communicate, timeout=60))[0]
        assert probe.returncode == 0 and f'version="{PYPROJECT_VERSION}"' in said, said
    finally:
        # SIGTERM, as the kubelet sends. Awaited in a thread: the emulated API is served by this test's event loop,
        # and a blocking wait here would leave the operator's last requests (Kopf's peering goodbye) unanswered.
        signalled = time.monotonic()
        rc = await asyncio.to_thread(images.stop, proc, EXIT_BOUND)
        exited = time.monotonic() - signalled
    output = tail(log, 100_000)
    assert "Traceback" not in output, output[-3000:]
    print(f"exit: rc {rc} {exited:.1f} s after SIGTERM")
    assert rc == 0 and exited < EXIT_BOUND, f"rc {rc} after {exited:.1f} s\n{output[-3000:]}"
    if any(a.startswith("--peering") for a in container["args"]):
        # A clean exit drops this replica's record from the peering object: a standby resumes at once.
        peering = next(d for d in docs if d["apiVersion"] == CLUSTER_PEERING.api_version)["metadata"]["name"]
        record = await harness.call("GET", f"{CLUSTER_PEERING.collection_path('')}/{peering}")
        assert not (record.get("status") or {}), record


def test_run_rootfs_really_is_read_only(operator_image):
    """The harness itself: a write to / fails inside, a write to the tmpfs works, the uid is the one asked for."""
    proc = images.run_rootfs(
        operator_image,
        ["sh", "-c", "id -u; touch /probe || echo RO; touch /tmp/ok && echo TMP"],
        uid=12345,
        gid=12345,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out = proc.communicate(timeout=60)[0]
    assert out.split()[0] == "12345" and "RO" in out and "TMP" in out, out
    assert not (operator_image / "rootfs" / "probe").exists()
