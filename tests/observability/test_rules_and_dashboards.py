"""Static checks of the alert rules and dashboards: promtool, the metric catalogue, the docs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from obs_helpers import (
    ALERTS_FILE,
    METRIC_RE,
    ROOT,
    VLLM_METRICS,
    alert_rules,
    catalogue_names,
    dashboards,
    panel_queries,
    tool,
)

ALERTS_TEST = Path(__file__).parent / "alerts_test.yaml"


def test_promtool_check_rules():
    proc = subprocess.run([tool("promtool"), "check", "rules", str(ALERTS_FILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in proc.stdout


def test_promtool_check_rules_rejects_a_broken_rule(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        ALERTS_FILE.read_text().replace(
            "max by (namespace, run) (rlt_run_phase", "max by (namespace, run (rlt_run_phase", 1
        )
    )
    proc = subprocess.run([tool("promtool"), "check", "rules", str(broken)], capture_output=True, text=True)
    assert proc.returncode != 0


def test_promtool_unit_tests_of_the_alerts():
    proc = subprocess.run(
        [tool("promtool"), "test", "rules", str(ALERTS_TEST)], capture_output=True, text=True, cwd=ALERTS_TEST.parent
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_is_unit_tested():
    tested = set(re.findall(r"alertname:\s*(\w+)", ALERTS_TEST.read_text()))
    assert {r["alert"] for r in alert_rules()} <= tested


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda r: r["alert"])
def test_alert_has_severity_summary_and_runbook(rule):
    assert rule["labels"]["severity"] in ("warning", "critical")
    assert rule["annotations"]["summary"].strip()
    assert rule["annotations"]["description"].strip()
    doc = (ROOT / "docs" / "alerts.md").read_text()
    section = re.search(rf"^## {rule['alert']}\n(.*?)(?=^## |\Z)", doc, re.M | re.S)
    assert section, f"docs/alerts.md has no '## {rule['alert']}' section"
    body = section.group(1)
    for heading in ("Meaning", "Severity", "Diagnosis", "Mitigation"):
        assert f"**{heading}.**" in body, f"runbook of {rule['alert']} lacks {heading}"
    assert rule["labels"]["severity"] in body


def _names_in(text: str) -> set[str]:
    return set(METRIC_RE.findall(text))


def test_alerts_and_dashboards_use_only_known_metrics():
    known = catalogue_names() | VLLM_METRICS
    used: set[str] = set()
    for rule in alert_rules():
        used |= _names_in(rule["expr"])
    for dash in dashboards().values():
        for _, _, expr in panel_queries(dash):
            used |= _names_in(expr)
    assert used, "no metric names found"
    unknown = sorted(used - known)
    assert not unknown, f"not in training/rlt/contract/metrics.py ALL_METRICS (or vLLM's list): {unknown}"


def test_dashboards_are_generated_and_current():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gen_dashboards.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", sorted(dashboards()))
def test_dashboard_structure(name):
    dash = dashboards()[name]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"namespace", "run"} <= variables.keys()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
            # a run's query is filtered by the dashboard's variables; the operator's own series are operator-wide
            operator_wide = ("rlt_operator", 'controller="rltrun"', "up{")
            assert "$run" in t["expr"] or "$namespace" in t["expr"] or any(o in t["expr"] for o in operator_wide)
    assert '"uid": "' not in str(dash).replace("'uid': '${datasource}'", "")  # no hard-coded datasource UID


def test_required_panels_exist():
    titles = {d["uid"]: {p["title"] for p in d["panels"]} for d in dashboards().values()}
    assert {
        "Phase",
        "Stage",
        "Step rate",
        "Reward mean and spread",
        "Reward components",
        "Policy KL",
        "Checkpoint age",
        "Restarts",
    } <= titles["rlt-overview"]
    assert {
        "vLLM generation tokens/s",
        "Requests running and waiting",
        "Request latency p50 / p95",
        "KV cache usage",
    } <= titles["rlt-generation"]
    assert {"Step time by phase", "Scored tokens/s"} <= titles["rlt-training"]
    assert {"Operator up", "Reconciles/s by result", "Reconcile latency p50 / p95"} <= titles["rlt-operator"]


# A selector of one of our series: `rlt_step_phase_seconds_sum{namespace=~"$namespace", phase="generate"}`.
SELECTOR_RE = re.compile(r"\b(rlt_[a-z0-9_]+|controller_runtime_[a-z_]+|rest_client_[a-z_]+)\{([^}]*)\}")
MATCHER_RE = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
# Labels a scrape adds to every series (the Pod's namespace is also a run label).
SCRAPE_LABELS = {"namespace", "pod", "instance", "job", "container", "endpoint", "service"}


def _selectors() -> list[tuple[str, str, str, str, str]]:
    """(where, series, label, operator, value) for every label matcher on one of our series."""
    found = []
    queries = [(f"alert {r['alert']}", r["expr"]) for r in alert_rules()]
    queries += [(f"{name}: {title}", expr) for name, d in dashboards().items() for title, _, expr in panel_queries(d)]
    for where, expr in queries:
        for series, matchers in SELECTOR_RE.findall(expr):
            found += [(where, series, *m) for m in MATCHER_RE.findall(matchers)]
    return found


def _label_values() -> dict[tuple[str, str], set[str]]:
    """(metric, label) -> the values the code can give that label, where they are a bounded set."""
    from rlt.contract.method_registry import METHOD_NAMES
    from rlt.contract.metrics import ALL_METRICS, RUN_CONDITION
    from rlt.contract.stage_registry import STAGE_ORDER
    from rlt_operator.status.model import ConditionType

    values: dict[tuple[str, str], set[str]] = {}
    for d in ALL_METRICS:
        values |= {(d.name, label): {str(v) for v in vals} for label, vals in d.bounded}
        if "stage" in d.labels:
            values[d.name, "stage"] = set(STAGE_ORDER)
        if "method" in d.labels:
            values[d.name, "method"] = set(METHOD_NAMES)
    values[RUN_CONDITION, "type"] = {str(t) for t in ConditionType}
    values[RUN_CONDITION, "status"] = {"True", "False", "Unknown"}
    return values


def _catalogued(series: str):
    from rlt.contract.metrics import METRIC_DEFS

    for suffix in ("_bucket", "_sum", "_count", ""):
        d = METRIC_DEFS.get(series.removesuffix(suffix)) if series.endswith(suffix) else None
        if d is not None and (suffix == "" or d.kind == "histogram"):
            return d, suffix
    raise AssertionError(f"{series} is not in the catalogue")


def test_alerts_and_dashboards_name_only_labels_and_values_the_code_gives():
    """A retyped label value (`phase="generation"`, `type="TrainerRuning"`) matches no series: the panel is empty
    and the alert never fires, silently. Every label a rule or panel matches on must be the series' own or a scrape's,
    and every literal value one the code emits: the catalogue's bounded values, a stage, a method, a condition type,
    or a reason the operator's code writes."""
    operator_code = "\n".join(p.read_text() for p in (ROOT / "operator" / "rlt_operator").rglob("*.py"))
    values = _label_values()
    selectors = _selectors()
    assert any(label == "phase" and value == "generate" for _, _, label, _, value in selectors)
    wrong = []
    for where, series, label, op, value in selectors:
        d, suffix = _catalogued(series)
        if label not in {*d.labels, *SCRAPE_LABELS, *(("le",) if suffix == "_bucket" else ())}:
            wrong.append(f"{where}: {series} has no label {label!r}")
            continue
        if op not in ("=", "=~") or "$" in value or not value:
            continue  # a dashboard variable, or a negative matcher
        literals = value.split("|") if op == "=~" else [value]
        for literal in literals:
            if not re.fullmatch(r"[\w-]+", literal):
                wrong.append(f"{where}: {label}=~{value!r} is not a list of literal values this test can check")
            elif label == "reason":
                if f'"{literal}"' not in operator_code:
                    wrong.append(f"{where}: no reason {literal!r} in the operator's code")
            elif (d.name, label) in values and literal not in values[d.name, label]:
                wrong.append(f"{where}: {d.name}'s {label} is never {literal!r}: {sorted(values[d.name, label])}")
    assert not wrong, "\n".join(wrong)
