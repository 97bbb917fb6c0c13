"""`rlt crd` prints the committed CRD; `rlt operator` (a real process) serves runs, liveness included.
Child status is not needed here; the emulated API runs no controllers."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import signal
import subprocess
import sys
import urllib.request

import pytest
from op_harness import example, write_kubeconfig
from suite_helpers import PYPROJECT_VERSION, free_port, hack_module

pytestmark = pytest.mark.timeout(60)
RLT = [sys.executable, "-c", "from rlt.cli import main; raise SystemExit(main())"]


def test_rlt_crd_prints_the_committed_file():
    out = subprocess.run(RLT + ["crd"], capture_output=True, text=True, check=True).stdout
    assert out == hack_module("generate").CRD_PATH.read_text()


async def test_rlt_operator_process(harness, tmp_path):
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", harness.url)
    health = free_port()
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "RLT_OPERATOR_METRICS_PORT": "-1",
        "RLT_OPERATOR_HEALTH_PORT": str(health),
    }
    watches = harness.count_watches()
    proc = await asyncio.create_subprocess_exec(
        *RLT, "operator", "--all-namespaces", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        await harness.wait(lambda: harness.count_watches() - watches >= 7, "operator watches", timeout=30)
        await harness.create_run(example())
        await harness.wait_object("jobs", "tiny-sft")

        def healthz() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=3) as r:
                return r.read().decode()

        assert '"runs": 1' in await asyncio.to_thread(healthz)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()[-2000:]
    # which build is running, first thing in its log (rlt's version is pyproject's, the one the images are tagged with)
    assert f"rlt-operator {PYPROJECT_VERSION} (kopf {importlib.metadata.version('kopf')}) starting" in err.decode()


@pytest.mark.parametrize(
    ("kubeconfig", "says"),
    [
        (None, "No configuration found"),  # no file there
        ("folder", "Is a directory"),
        ("clusters: [unclosed", "expected ',' or ']'"),  # not YAML
        ("- a list\n", "not a kubeconfig (TypeError"),  # YAML, not a kubeconfig
    ],
)
def test_rlt_operator_without_a_cluster_says_so_in_one_line_and_exits(tmp_path, kubeconfig, says):
    """No service account and no usable kubeconfig: one line naming the file and why, exit 1, at once (in Kopf's
    startup handler it was two tracebacks retried every minute, for ever)."""
    path = tmp_path / "kubeconfig"
    if kubeconfig == "folder":
        path.mkdir()
    elif kubeconfig is not None:
        path.write_text(kubeconfig)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE")}
    env |= {"KUBECONFIG": str(path), "HOME": str(tmp_path), "RLT_OPERATOR_METRICS_PORT": "-1"}
    done = subprocess.run([*RLT, "operator", "--all-namespaces"], env=env, capture_output=True, text=True, timeout=50)
    assert done.returncode == 1, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"rlt operator: no cluster to connect to: not in a pod, and the kubeconfig {path}: "
    ), lines[-5:]
    assert says in lines[0]
