"""Shared helpers of the observability tests (real promtool / prometheus binaries)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from suite_helpers import ROOT, find_tool

CHART = ROOT / "charts" / "rlt-operator"
ALERTS_FILE = CHART / "files" / "alerts" / "rlt-alerts.yaml"
DASHBOARD_DIR = CHART / "files" / "dashboards"

RATE_WINDOW = "5m"  # stands in for $__rate_interval: wide enough to hold the whole tiny run
METRIC_RE = re.compile(r"\b(rlt_[a-z0-9_]+|vllm:[a-z0-9_:]+)")

# vLLM's own metrics the dashboards and alerts may use (vLLM v1 docs/design/metrics.md).
VLLM_METRICS = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:num_preemptions_total",
}


def tool(name: str) -> str:
    path = find_tool(name)
    if not path:
        pytest.skip(f"{name} not found: run `make tools` (make test installs it)")
    return path


def alert_rules() -> list[dict]:
    doc = yaml.safe_load(ALERTS_FILE.read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARD_DIR.glob("*.json"))}


def panel_queries(dash: dict) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) for every query of a dashboard."""
    return [(p["title"], t["refId"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def catalogue_names() -> set[str]:
    """Every series name the catalogue's collectors expose (histograms as _bucket/_sum/_count)."""
    from rlt.contract.metrics import ALL_METRICS

    names: set[str] = set()
    for d in ALL_METRICS:
        if d.kind == "histogram":
            names |= {d.name + s for s in ("_bucket", "_sum", "_count")}
        else:
            names.add(d.name)
    return names


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
