"""`rlt sandbox` + a real kubectl: an applied example shows its children and a Phase column.
The sandbox is a preview of what the operator would create, not a cluster (no pod ever runs)."""

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
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl", path=f"{ROOT / '.tools' / 'bin'}:{os.environ.get('PATH', '')}")

pytestmark = [pytest.mark.timeout(90), pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_kubectl_against_the_sandbox(tmp_path):
    port = free_port()
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
    try:
        banner = ""
        deadline = time.monotonic() + 30
        while "Ctrl-C" not in banner and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            banner += line
        assert f"export KUBECONFIG={kubeconfig}" in banner
        assert "not a cluster" in banner

        def kubectl(*args: str) -> str:
            out = subprocess.run(
                [KUBECTL, f"--kubeconfig={kubeconfig}", f"--cache-dir={tmp_path / 'cache'}", *args],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert out.returncode == 0, out.stderr
            return out.stdout

        assert "rltrun.rlt.dev/tiny created" in kubectl(
            "apply", "--validate=false", "-f", str(ROOT / "manifests/examples/rltrun-tiny.yaml")
        )
        deadline = time.monotonic() + 20
        table = ""
        while time.monotonic() < deadline:
            table = kubectl("get", "rlt")
            if "Running" in table:
                break
            time.sleep(0.3)
        header = table.splitlines()[0].split()
        assert header == ["NAME", "PHASE", "STAGE", "STEP", "REWARD", "RESTARTS", "AGE"]
        assert table.splitlines()[1].split()[:3] == ["tiny", "Running", "sft"]
        # -o wide adds Reason and Message: an invalid run says why it is held
        bad = yaml.safe_load((ROOT / "manifests/examples/rltrun-tiny.yaml").read_text())
        bad["metadata"]["name"] = "bad"
        bad["spec"]["format"] = {"preset": "rcl-default"}
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
        kubectl("apply", "--validate=false", "-f", str(tmp_path / "bad.yaml"))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            wide = kubectl("get", "rlt", "bad", "-o", "wide")
            if "InvalidSpec" in wide:
                break
            time.sleep(0.3)
        assert wide.splitlines()[0].split()[-2:] == ["REASON", "MESSAGE"]
        assert wide.splitlines()[1].split()[:2] == ["bad", "Pending"] and "InvalidSpec" in wide
        assert "spec.format.preset" in wide
        children = kubectl(
            "get", "configmaps,persistentvolumeclaims,services,jobs", "-l", "rlt.dev/run=tiny", "-o", "name"
        )
        assert set(children.split()) == {
            "configmap/tiny-config",
            "persistentvolumeclaim/tiny-data",
            "service/tiny-sft",
            "job.batch/tiny-sft",
        }
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
