"""What kubectl and helm need from `rlt sandbox` beyond get/apply: Events (listed, and per object in describe),
OpenAPI v3 for `kubectl explain` and client-side validation, `helm install` (and --dry-run), and `kubectl get -w`
keeping its columns. Real kubectl and helm binaries against the emulated API (not a cluster)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = f"{ROOT / '.tools' / 'bin'}:{os.environ.get('PATH', '')}"
KUBECTL = shutil.which("kubectl", path=TOOLS)
HELM = shutil.which("helm", path=TOOLS)

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(KUBECTL is None or HELM is None, reason="kubectl/helm not installed"),
]


@pytest.fixture()
def sandbox(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    env = {**os.environ, "RLT_OPERATOR_METRICS_PORT": "-1", "RLT_RESYNC_SECONDS": "2"}
    env.pop("KUBECONFIG", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from rlt.cli import main; raise SystemExit(main())",
            "sandbox",
            "--port",
            str(port),
            "--kubeconfig",
            str(kubeconfig),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    banner = ""
    deadline = time.monotonic() + 30
    while "Ctrl-C" not in banner and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        banner += line
    assert "Ctrl-C" in banner, banner
    client_env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "HELM_CACHE_HOME": str(tmp_path / "helm-cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "helm-config"),
        "HELM_DATA_HOME": str(tmp_path / "helm-data"),
    }

    def run(tool: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
        cmd = [tool, *args] + ([f"--cache-dir={tmp_path / 'cache'}"] if tool == KUBECTL else [])
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=client_env)
        if ok:
            assert out.returncode == 0, (args, out.stderr)
        return out

    try:
        yield run, client_env
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for(fn, what: str, seconds: float = 20.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_events_explain_validation_and_helm_dry_run(sandbox):
    run, _ = sandbox
    kubectl = lambda *a, **kw: run(KUBECTL, *a, **kw)  # noqa: E731
    tiny = (ROOT / "manifests/examples/rltrun-tiny.yaml").read_text()
    # client-side validation on (no --validate=false): kubectl finds fieldValidation in the OpenAPI v3 document
    assert (
        "rltrun.rlt.dev/tiny created"
        in kubectl("apply", "-f", str(ROOT / "manifests/examples/rltrun-tiny.yaml")).stdout
    )
    subprocess.run(
        [KUBECTL, "apply", "-f", "-"],
        input=tiny.replace("name: tiny", "name: other"),
        text=True,
        env=sandbox[1],
        check=True,
        capture_output=True,
    )

    events = wait_for(
        lambda: (out := kubectl("get", "events").stdout).count("rltrun/") >= 4 and out, "events of 2 runs"
    )
    assert events.splitlines()[0].split() == ["NAME", "LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert "rltrun/tiny" in events and "rltrun/other" in events

    described = kubectl("describe", "rltrun", "tiny").stdout
    section = described.split("Events:", 1)[1]
    assert "stage sft started" in section
    # only this run's Events: its trainer event names tiny's Job, never other's
    assert section.count("stage sft started") == 1

    explained = kubectl("explain", "rltrun.spec.stages.rl").stdout
    assert "GRPO of the teacher with the RLT reward" in explained
    assert "numGenerations" in explained and "G: completions per question." in explained
    assert "Optimizer steps." in kubectl("explain", "rltrun.spec.stages.rl.steps").stdout

    chart = ROOT / "charts/rlt-operator"
    dry = run(
        HELM,
        "install",
        "--dry-run",
        "rlt",
        str(chart),
        "--namespace",
        "default",
        "--set",
        "image.repository=example.org/rlt-operator",
    )
    assert "kind: Deployment" in dry.stdout and "STATUS: pending-install" in dry.stdout
    assert kubectl("get", "deployments", "-A", "-o", "name").stdout.strip() == ""  # a dry run creates nothing
    # a real install: Helm's release record is a protobuf Secret, which the glue decodes
    run(
        HELM,
        "install",
        "rlt",
        str(chart),
        "--namespace",
        "default",
        "--set",
        "image.repository=example.org/rlt-operator",
    )
    assert "deployed" in run(HELM, "list", "--namespace", "default").stdout
    assert kubectl("get", "deployments", "-o", "name").stdout.split() == ["deployment.apps/rlt-rlt-operator"]
    release = kubectl("get", "secret", "sh.helm.release.v1.rlt.v1", "-o", "jsonpath={.type} {.metadata.labels.status}")
    assert release.stdout == "helm.sh/release.v1 deployed"  # updated (PUT, protobuf) from pending-install
    run(HELM, "uninstall", "rlt", "--namespace", "default")


def test_watch_keeps_its_columns_and_does_not_repeat_rows(sandbox):
    run, env = sandbox
    run(KUBECTL, "apply", "-f", str(ROOT / "manifests/examples/rltrun-tiny.yaml"))
    wait_for(lambda: "Running" in run(KUBECTL, "get", "rlt").stdout, "the run to start")
    watch = subprocess.Popen(
        [KUBECTL, "get", "rlt", "-w", "--request-timeout=0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        header = watch.stdout.readline().split()
        first = watch.stdout.readline().split()
        run(
            KUBECTL,
            "patch",
            "job",
            "tiny-sft",
            "--subresource=status",
            "--type=merge",
            "-p",
            '{"status":{"succeeded":1,"conditions":[{"type":"Complete","status":"True"}]}}',
        )
        later = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any("rl" in line for line in later):
            later.append(watch.stdout.readline().split())
    finally:
        watch.kill()
        watch.wait()
    assert header == ["NAME", "PHASE", "STAGE", "STEP", "REWARD", "RESTARTS", "AGE"]
    assert first[:3] == ["tiny", "Running", "sft"]
    # after the first row every update is still a row of the same columns (it used to be the bare name)
    assert later and all(len(row) >= 5 and row[0] == "tiny" for row in later), later
    assert ["tiny", "Running", "rl"] in [row[:3] for row in later]
