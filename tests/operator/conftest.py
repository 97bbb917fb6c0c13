"""Kopf against kmock, in-process.

kmock (with rlt_sandbox.kmock_glue) is an in-memory stand-in for the Kubernetes API: it stores
objects and streams watch events, but runs no controllers. Whatever a Job, StatefulSet or kubelet
would do (pods appearing, readiness, success, failure) is SIMULATED by these tests through the
same HTTP API a controller would use (see op_harness.Harness).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# The kubernetes client reads $KUBECONFIG once, at import: point it at a file we rewrite per test.
_KUBECONFIG = Path(tempfile.mkdtemp(prefix="rlt-op-test-", dir=os.environ.get("RLT_SUITE_TMP"))) / "kubeconfig"
os.environ["KUBECONFIG"] = str(_KUBECONFIG)
os.environ["RLT_OPERATOR_METRICS_PORT"] = "0"
os.environ["RLT_OPERATOR_METRICS_ADDR"] = "127.0.0.1"
os.environ["RLT_RESYNC_SECONDS"] = "2"
os.environ["RLT_DEBOUNCE_SECONDS"] = "0.05"
os.environ["RLT_PROGRESS_INTERVAL"] = "0.3"
os.environ["RLT_PROGRESS_URL"] = "http://127.0.0.1:9/metrics"  # nothing listens here: no progress

import pytest  # noqa: E402
from op_harness import Harness, write_kubeconfig  # noqa: E402


@pytest.fixture
async def harness():
    h = Harness()
    async with h.serve():
        write_kubeconfig(_KUBECONFIG, h.url)
        try:
            yield h
        finally:
            await h.stop_operator()
