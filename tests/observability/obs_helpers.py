"""Shared helpers of the observability tests (real promtool / prometheus binaries)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rlt-operator"
ALERTS_FILE = CHART / "files" / "alerts" / "rlt-alerts.yaml"
DASHBOARD_DIR = CHART / "files" / "dashboards"
TOOLS = ROOT / ".tools" / "bin"

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
    path = shutil.which(
        name, path=os.pathsep.join([str(TOOLS), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )
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
    from rlt.metrics import ALL_METRICS

    names: set[str] = set()
    for d in ALL_METRICS:
        if d.kind == "histogram":
            names |= {d.name + s for s in ("_bucket", "_sum", "_count")}
        else:
            names.add(d.name)
    return names
