"""`rlt monitor`: the chart's monitoring on a laptop. A real Prometheus (make tools) with the configuration the command
writes, scraping a real rank-0 exporter (rlt.contract.metrics.TrainerMetrics), and the dashboards drawn from it.
(The whole pipeline with a real run's every series is tests/observability/test_dashboards_live.py, which draws the
dashboards with the same renderer.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from obs_helpers import DASHBOARD_DIR, dashboards, tool
from suite_helpers import free_port

from rlt.contract.metrics import TrainerMetrics
from rlt_sandbox.monitoring import grafana_provisioning, prometheus_config


def test_the_config_holds_the_run_the_operators_service_monitor_and_the_charts_rules(tmp_path):
    promtool = tool("promtool")
    config = prometheus_config(tmp_path, "127.0.0.1:9400", "127.0.0.1:9401", tool("helm"))
    jobs = [c["job_name"] for c in config["scrape_configs"]]
    assert jobs[0] == "rlt-trainer" and config["scrape_configs"][0]["honor_labels"] is True
    assert any(j.startswith("serviceMonitor/") for j in jobs), jobs  # the operator through the chart's own object
    assert [Path(r).name for r in config["rule_files"]] == ["rlt-alerts.yaml"]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    checked = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr  # promtool also loads the rule files
    root = grafana_provisioning(tmp_path, "http://127.0.0.1:9090")
    source = yaml.safe_load((root / "datasources" / "rlt.yaml").read_text())["datasources"][0]
    assert (source["type"], source["url"]) == ("prometheus", "http://127.0.0.1:9090")


def test_without_anything_to_scrape_it_says_so():
    out = subprocess.run([sys.executable, "-m", "rlt.cli", "monitor"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "give a run file, --trainer HOST:PORT or --operator HOST:PORT" in out.stderr


@pytest.mark.timeout(240)
def test_it_scrapes_a_running_exporter_and_draws_every_dashboard(tmp_path):
    tool("prometheus")
    metrics = TrainerMetrics(run="laptop", namespace="local")
    port = metrics.serve(0)
    metrics.stage = "rl"
    metrics.set("rlt_step", 3)
    metrics.set("rlt_total_steps", 6)
    metrics.set("rlt_reward_mean", -2.5)
    out = tmp_path / "dash"
    cmd = [sys.executable, "-m", "rlt.cli", "monitor", "--trainer", f"127.0.0.1:{port}", "--port", str(free_port())]
    cmd += ["--output-dir", str(out), "--every", "3", "--work", str(tmp_path / "work")]
    log = tmp_path / "monitor.log"
    # started with SIGINT ignored, as a child of a process that ignores it (a launcher, a test worker after another
    # test's handler) is: Ctrl-C must still stop it (it once drew on for ever in CI)
    ignoring = ["sh", "-c", 'trap "" INT; exec "$@"', "sh"]  # exec keeps the ignored signal ignored
    proc = subprocess.Popen([*ignoring, *cmd], stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        # the first drawing may come before the first scrape: wait for one that shows the reward
        while "Reward mean" in _empty_panels(log) and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(1)
        said = log.read_text()
        assert "Reward mean" not in _empty_panels(log), said
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
        metrics.shutdown()
    assert proc.returncode == 130, said  # Ctrl-C: Prometheus stopped with it
    names = {p.name for p in out.glob("*.png")}
    assert names == {f"{Path(n).stem}.png" for n in dashboards()}
    assert all((out / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)
    # an empty panel says whose metrics it waits for: the operator's need --operator, vLLM's a server
    empty = _empty_panels(log)
    assert "(operator)" in empty and "RLTRun overview / Phase (operator)" in empty
    assert "Reward mean and spread" not in empty
    total = sum(len(d["panels"]) for d in dashboards().values())
    assert f"of {total} panels with data" in said
    assert DASHBOARD_DIR.is_dir()


def _empty_panels(log: Path) -> str:
    lines = [line for line in log.read_text().splitlines() if "panels with data" in line]
    return lines[-1].split("without:", 1)[-1] if lines else "Reward mean (nothing drawn yet)"
