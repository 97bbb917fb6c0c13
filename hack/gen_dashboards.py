#!/usr/bin/env python3
"""Generate the chart's Grafana dashboards (charts/rlt-operator/files/dashboards/*.json) and their
panel → query table (docs/dashboards.md) from the compact definitions below.

    python hack/gen_dashboards.py           # write both
    python hack/gen_dashboards.py --check   # exit 1 if the committed files differ (the tests do this)

Every `rlt_*` name used here must be in training/rlt/contract/metrics.py (a test checks it); `vllm:*` are vLLM's
own metrics from the generator pods. Queries use the template variables $namespace, $run and Grafana's
$__rate_interval; the datasource is the variable ${datasource}, never a fixed UID.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "charts" / "rlt-operator" / "files" / "dashboards"
DOC = ROOT / "docs" / "dashboards.md"

S = 'namespace=~"$namespace", run=~"$run"'
RI = "$__rate_interval"
CR = 'controller="rltrun"'  # the operator's controller in controller-runtime's series (rlt.contract.metrics.CONTROLLER)
OPJOB = 'job="rlt-operator"'  # the Service's fixed jobLabel value (a PodMonitor's job is <namespace>/<name>)


@dataclass
class Target:
    expr: str
    legend: str = ""


@dataclass
class Panel:
    title: str
    description: str
    targets: list[Target]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat | table
    width: int = 12
    height: int = 8
    stack: bool = False
    extra_defaults: dict = field(default_factory=dict)


@dataclass
class Dashboard:
    uid: str
    title: str
    file: str
    description: str
    panels: list[Panel]
    # The run picker lists the runs the operator reports (rlt_run_phase: Pending ones too, before any trainer
    # exists) and those only a trainer reports (`rlt run` on a laptop, no operator).
    run_variable_metrics: tuple[str, ...] = ("rlt_run_phase", "rlt_step")


def rate(metric: str, sel: str = S) -> str:
    braces = f"{{{sel}}}" if sel else ""
    return f"rate({metric}{braces}[{RI}])"


def phase_mean(phase_sel: str = "") -> str:
    sel = S + (", " + phase_sel if phase_sel else "")
    return (
        f"sum by (namespace, run, phase) ({rate('rlt_step_phase_seconds_sum', sel)})\n"
        f"/\nsum by (namespace, run, phase) ({rate('rlt_step_phase_seconds_count', sel)})"
    )


OVERVIEW = Dashboard(
    uid="rlt-overview",
    title="RLTRun overview",
    file="rlt-overview.json",
    description="One row per run: phase and stage from the operator, progress, reward and KL from trainer rank 0.",
    panels=[
        Panel(
            "Phase",
            "Current phase of each run (operator: rlt_run_phase).",
            [Target(f"max by (namespace, run, phase) (rlt_run_phase{{{S}}}) == 1", "{{run}}: {{phase}}")],
            kind="table",
            width=8,
        ),
        Panel(
            "Stage",
            "Stage the operator is running (rlt_run_info carries it as a label).",
            [Target(f"max by (namespace, run, stage, method) (rlt_run_info{{{S}}})", "{{run}}: {{stage}}")],
            kind="table",
            width=8,
        ),
        Panel(
            "Restarts",
            "Gang restarts from the last checkpoint (status.restarts).",
            [Target(f"max by (namespace, run) (rlt_run_restarts{{{S}}})", "{{run}}")],
            kind="stat",
            width=8,
        ),
        Panel(
            "Progress",
            "Optimizer step over planned steps of the current stage.",
            [
                Target(
                    f"max by (namespace, run, stage) (rlt_step{{{S}}})\n/\n"
                    f"max by (namespace, run, stage) (rlt_total_steps{{{S}}} > 0)",
                    "{{run}} {{stage}}",
                )
            ],
            unit="percentunit",
        ),
        Panel(
            "Step rate",
            "Optimizer steps per second (count of the step-time histogram).",
            [Target(f"sum by (namespace, run, stage) ({rate('rlt_step_seconds_count')})", "{{run}} {{stage}}")],
            unit="ops",
        ),
        Panel(
            "Reward mean and spread",
            "Mean total reward R of the last step and its standard deviation over the step's completions.",
            [
                Target(f"max by (namespace, run, stage) (rlt_reward_mean{{{S}}})", "{{run}} {{stage}} mean"),
                Target(f"max by (namespace, run, stage) (rlt_reward_std{{{S}}})", "{{run}} {{stage}} std"),
            ],
        ),
        Panel(
            "Reward components",
            "r_SS, r_KL, format penalty and the log-prob/KL terms behind them (mean over the last step).",
            [
                Target(
                    f"max by (namespace, run, stage, component) (rlt_reward_component{{{S}}})",
                    "{{run}} {{component}}",
                )
            ],
        ),
        Panel(
            "Policy KL",
            "GRPO KL of the teacher policy to its reference model.",
            [Target(f"max by (namespace, run, stage) (rlt_policy_kl{{{S}}})", "{{run}} {{stage}}")],
        ),
        Panel(
            "Loss",
            "Training loss at the last logged step.",
            [Target(f"max by (namespace, run, stage) (rlt_loss{{{S}}})", "{{run}} {{stage}}")],
        ),
        Panel(
            "Checkpoint age",
            "Seconds since the last checkpoint was written, and its step.",
            [
                Target(
                    f"time() - max by (namespace, run, stage) (rlt_checkpoint_timestamp_seconds{{{S}}})",
                    "{{run}} {{stage}} age",
                ),
            ],
            unit="s",
        ),
        Panel(
            "Checkpoint step",
            "Step of the last checkpoint written (runs resume from it after a restart).",
            [Target(f"max by (namespace, run, stage) (rlt_checkpoint_step{{{S}}})", "{{run}} {{stage}}")],
            kind="stat",
        ),
    ],
)

GENERATION = Dashboard(
    uid="rlt-generation",
    title="RLT generation",
    file="rlt-generation.json",
    description="Teacher generation: vLLM server metrics (vllm:*) of the generator pods, and tokens as the trainer counts them.",
    panels=[
        Panel(
            "Teacher tokens/s (trainer)",
            "Completion tokens generated for the trainer per second, in-process or through the servers.",
            [Target(f"sum by (namespace, run, stage) ({rate('rlt_generated_tokens_total')})", "{{run}} {{stage}}")],
        ),
        Panel(
            "Generate phase per step",
            "Mean seconds of each optimizer step spent waiting for completions.",
            [Target(phase_mean('phase="generate"'), "{{run}}")],
            unit="s",
        ),
        Panel(
            "vLLM generation tokens/s",
            "Tokens decoded per second by the generator servers of each run.",
            [Target(f"sum by (namespace, run) ({rate('vllm:generation_tokens_total')})", "{{run}}")],
        ),
        Panel(
            "vLLM prompt tokens/s",
            "Prompt tokens prefilled per second.",
            [Target(f"sum by (namespace, run) ({rate('vllm:prompt_tokens_total')})", "{{run}}")],
        ),
        Panel(
            "Requests running and waiting",
            "Requests in the running batch and in the waiting queue, summed over a run's servers.",
            [
                Target(f"sum by (namespace, run) (vllm:num_requests_running{{{S}}})", "{{run}} running"),
                Target(f"sum by (namespace, run) (vllm:num_requests_waiting{{{S}}})", "{{run}} waiting"),
            ],
        ),
        Panel(
            "KV cache usage",
            "Fraction of each server's KV cache in use (1 = full: requests queue or get preempted).",
            [Target(f"max by (namespace, run, pod) (vllm:kv_cache_usage_perc{{{S}}})", "{{run}} {{pod}}")],
            unit="percentunit",
        ),
        Panel(
            "Request latency p50 / p95",
            "End-to-end latency of a generation request.",
            [
                Target(
                    f"histogram_quantile(0.5, sum by (namespace, run, le) ({rate('vllm:e2e_request_latency_seconds_bucket')}))",
                    "{{run}} p50",
                ),
                Target(
                    f"histogram_quantile(0.95, sum by (namespace, run, le) ({rate('vllm:e2e_request_latency_seconds_bucket')}))",
                    "{{run}} p95",
                ),
            ],
            unit="s",
        ),
        Panel(
            "Time to first token p95",
            "95th percentile of the time to the first generated token.",
            [
                Target(
                    f"histogram_quantile(0.95, sum by (namespace, run, le) ({rate('vllm:time_to_first_token_seconds_bucket')}))",
                    "{{run}}",
                )
            ],
            unit="s",
        ),
    ],
)

TRAINING = Dashboard(
    uid="rlt-training",
    title="RLT training",
    file="rlt-training.json",
    description="Where the time of an optimizer step goes (generate / score / update / weight sync) and scoring throughput.",
    panels=[
        Panel(
            "Step time by phase",
            "Mean seconds per optimizer step in each phase, stacked.",
            [Target(phase_mean(), "{{run}} {{phase}}")],
            unit="s",
            stack=True,
        ),
        Panel(
            "Share of step time by phase",
            "Fraction of wall time per step spent in each phase.",
            [
                Target(
                    f"sum by (namespace, run, phase) ({rate('rlt_step_phase_seconds_sum')})\n"
                    f"/ ignoring (phase) group_left\n"
                    f"sum by (namespace, run) ({rate('rlt_step_seconds_sum')})",
                    "{{run}} {{phase}}",
                )
            ],
            unit="percentunit",
        ),
        Panel(
            "Step time p50 / p95",
            "Wall seconds per optimizer step.",
            [
                Target(
                    f"histogram_quantile(0.5, sum by (namespace, run, stage, le) ({rate('rlt_step_seconds_bucket')}))",
                    "{{run}} {{stage}} p50",
                ),
                Target(
                    f"histogram_quantile(0.95, sum by (namespace, run, stage, le) ({rate('rlt_step_seconds_bucket')}))",
                    "{{run}} {{stage}} p95",
                ),
            ],
            unit="s",
        ),
        Panel(
            "Rank imbalance",
            "How much longer the last step's micro-steps lasted than with equal work on every rank (1 = balanced): "
            "tokens each rank computed, and each rank's own micro-step seconds (near 1 under ZeRO-3, which puts "
            "the wait inside every rank's time); passes_*: rl's reference and old-policy forwards. Rows are dealt "
            "across ranks by tokens in every trained stage (rlt.stages.balance).",
            [
                Target(
                    f"max by (namespace, run, stage, measure) (rlt_rank_imbalance_ratio{{{S}}})", "{{run}} {{measure}}"
                )
            ],
        ),
        Panel(
            "Scored tokens/s",
            "Tokens (explanation + solution) the student scores per second for the reward.",
            [Target(f"sum by (namespace, run, stage) ({rate('rlt_scored_tokens_total')})", "{{run}} {{stage}}")],
        ),
        Panel(
            "Generated vs scored tokens",
            "Tokens generated by the teacher and scored by the student since the stage started.",
            [
                Target(
                    f"sum by (namespace, run, stage) (rlt_generated_tokens_total{{{S}}})", "{{run}} {{stage}} generated"
                ),
                Target(f"sum by (namespace, run, stage) (rlt_scored_tokens_total{{{S}}})", "{{run}} {{stage}} scored"),
            ],
        ),
        Panel(
            "Steps",
            "Current and planned optimizer steps of each stage.",
            [
                Target(f"max by (namespace, run, stage) (rlt_step{{{S}}})", "{{run}} {{stage}} step"),
                Target(f"max by (namespace, run, stage) (rlt_total_steps{{{S}}})", "{{run}} {{stage}} planned"),
            ],
        ),
        Panel(
            "Stages completed",
            "1 once a stage has finished.",
            [Target(f"max by (namespace, run, stage) (rlt_stage_completed{{{S}}})", "{{run}} {{stage}}")],
            kind="stat",
        ),
        Panel(
            "Distillation rows written",
            "Rows of the distillation dataset written so far.",
            [Target(f"sum by (namespace, run) (rlt_distill_rows_total{{{S}}})", "{{run}}")],
            kind="stat",
        ),
    ],
)

OPERATOR = Dashboard(
    uid="rlt-operator",
    title="RLT operator",
    file="rlt-operator.json",
    description="Health of the rlt operator: scrape status, replicas by version, reconcile rate, errors and latency, "
    "runs by phase.",
    run_variable_metrics=("rlt_run_phase",),
    panels=[
        Panel(
            "Operator up",
            "1 while Prometheus scrapes the operator's /metrics.",
            [Target(f"max by (instance) (up{{{OPJOB}}})", "{{instance}}")],
            kind="stat",
            width=6,
        ),
        Panel(
            "Replicas by version",
            "Each scraped replica, labelled with the rlt version it runs (rlt_operator_build_info): 1 works, 0 is a "
            "standby. Two versions side by side: a rolling upgrade under way, or one stuck.",
            [
                Target(
                    f"max by (instance, version) (rlt_operator_active{{{OPJOB}}}\n"
                    f"  * on (instance, job) group_left (version) rlt_operator_build_info{{{OPJOB}}})",
                    "{{instance}} {{version}}",
                )
            ],
            kind="stat",
            width=6,
        ),
        Panel(
            "Runs by phase",
            "Number of RLTRuns in each phase.",
            [Target(f"count by (phase) (rlt_run_phase{{{S}}} == 1)", "{{phase}}")],
            kind="stat",
            width=12,
        ),
        Panel(
            "Reconciles/s by result",
            "RLTRun reconciles per second by result (controller-runtime's: success, requeue_after, error).",
            [Target(f"sum by (result) ({rate('controller_runtime_reconcile_total', CR)})", "{{result}}")],
            unit="ops",
        ),
        Panel(
            "Reconcile error ratio",
            "Share of reconciles that raised (0 when there were none).",
            [
                Target(
                    "(sum(" + rate("controller_runtime_reconcile_errors_total", CR) + ") or vector(0))\n"
                    f"/\nsum({rate('controller_runtime_reconcile_total', CR)})",
                    "errors",
                )
            ],
            unit="percentunit",
        ),
        Panel(
            "Reconcile latency p50 / p95",
            "Seconds per reconcile.",
            [
                Target(
                    f"histogram_quantile(0.5, sum by (le) ({rate('controller_runtime_reconcile_time_seconds_bucket', CR)}))",
                    "p50",
                ),
                Target(
                    f"histogram_quantile(0.95, sum by (le) ({rate('controller_runtime_reconcile_time_seconds_bucket', CR)}))",
                    "p95",
                ),
            ],
            unit="s",
        ),
        Panel(
            "Step seen by the operator",
            "status.progress.step of each run as the operator last wrote it.",
            [Target(f"max by (namespace, run) (rlt_run_step{{{S}}})", "{{run}}")],
        ),
    ],
)

DASHBOARDS = (OVERVIEW, GENERATION, TRAINING, OPERATOR)


def _variables(d: Dashboard) -> list[dict]:
    ds = {"type": "prometheus", "uid": "${datasource}"}
    names = f'__name__=~"{"|".join(d.run_variable_metrics)}"'
    common = {"includeAll": True, "multi": True, "allValue": ".*", "refresh": 2, "sort": 1, "type": "query"}
    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus", "hide": 0},
        {
            **common,
            "name": "namespace",
            "label": "Namespace",
            "datasource": ds,
            "query": {"query": f"label_values({{{names}}}, namespace)", "refId": "namespace"},
        },
        {
            **common,
            "name": "run",
            "label": "Run",
            "datasource": ds,
            "query": {
                "query": f'label_values({{{names}, namespace=~"$namespace"}}, run)',
                "refId": "run",
            },
        },
    ]


def _panel(p: Panel, pid: int, x: int, y: int) -> dict:
    ds = {"type": "prometheus", "uid": "${datasource}"}
    defaults: dict = {"unit": p.unit}
    if p.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 20 if p.stack else 0,
            "stacking": {"mode": "normal" if p.stack else "none", "group": "A"},
        }
    defaults.update(p.extra_defaults)
    out = {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": ds,
        "gridPos": {"x": x, "y": y, "w": p.width, "h": p.height},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": ds,
                "expr": t.expr,
                "legendFormat": t.legend or "__auto",
                "range": p.kind == "timeseries",
                "instant": p.kind != "timeseries",
            }
            for i, t in enumerate(p.targets)
        ],
    }
    if p.kind == "timeseries":
        out["options"] = {
            "legend": {"displayMode": "table", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif p.kind == "stat":
        out["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none",
            "textMode": "value_and_name",
        }
    else:
        out["options"] = {"showHeader": True}
        out["transformations"] = [{"id": "labelsToFields", "options": {}}]
    return out


def render(d: Dashboard) -> dict:
    panels, x, y, row_h = [], 0, 0, 0
    for i, p in enumerate(d.panels, start=1):
        if x + p.width > 24:
            x, y, row_h = 0, y + row_h, 0
        panels.append(_panel(p, i, x, y))
        x += p.width
        row_h = max(row_h, p.height)
    return {
        "uid": d.uid,
        "title": d.title,
        "description": d.description,
        "tags": ["rlt"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "browser",
        "templating": {"list": _variables(d)},
        "annotations": {"list": []},
        "links": [
            {
                "title": "RLT dashboards",
                "type": "dashboards",
                "tags": ["rlt"],
                "asDropdown": True,
                "icon": "external link",
                "includeVars": True,
                "keepTime": True,
                "targetBlank": False,
                "tooltip": "The other RLT dashboards, same run and time range",
                "url": "",
            }
        ],
        "panels": panels,
    }


def render_doc() -> str:
    lines = [
        "# Dashboards",
        "",
        "The chart ships four Grafana dashboards (`charts/rlt-operator/files/dashboards/`), loaded by the Grafana",
        "sidecar of kube-prometheus-stack when `grafanaDashboards.enabled=true` (see [install.md](install.md)).",
        "Each has the variables `datasource` (any Prometheus data source), `namespace` and `run`; `run` lists the",
        "runs the operator reports (`rlt_run_phase`, so a Pending run is listed before any trainer starts) and the",
        "runs only a trainer reports (`rlt_step`, a local `rlt run`).",
        "This page is generated by `python hack/gen_dashboards.py` from the same definitions as the JSON;",
        "metric meanings are in [metrics.md](metrics.md). `tests/observability/` runs every query below against",
        "a real Prometheus scraping a real local run and the operator's exporter (through the scrape config",
        "the chart's ServiceMonitor becomes).",
        "",
        "## On your laptop: `rlt monitor`",
        "",
        "After `make tools` (which installs Prometheus), one command runs a run file with its metrics served, starts",
        "the real Prometheus with the chart's scrape configuration and alert rules, and draws these dashboards as PNGs",
        "from the same queries every 30 s and once more when the run ends:",
        "",
        "```bash",
        "rlt monitor manifests/examples/rltrun-local.yaml   # the demo; PNGs in results/smollm2-local/dashboards/",
        "```",
        "",
        "It prints Prometheus' address (its graph page and `/alerts` show the chart's rules on the local run) and a",
        "`docker run` line for Grafana's official image with provisioning files it wrote (the local Prometheus as the",
        "datasource, the chart's dashboards as a file provider), for a machine with a container runtime (not run on",
        "ours: they have no container engine). `--trainer HOST:PORT` scrapes a run already serving",
        "(`rlt run FILE --metrics-port PORT`); `--operator HOST:PORT` adds the operator's metrics, through the scrape",
        "config the chart's ServiceMonitor becomes, from `rlt sandbox` started with `RLT_OPERATOR_METRICS_PORT=PORT`.",
        "A panel with no data says whose metrics it waits for: the operator's panels need `--operator`, vLLM's a",
        "generator server.",
        "",
        "How long it takes (2026-11-28, 2 cores, beside another test suite, load ~3–6): `rlt monitor",
        "manifests/examples/rltrun-local.yaml` drew the first dashboards within 30 s, the reward panels from about 3 min",
        "(after SFT's 95 s and the first rl step), and the run ended at 7.7 min; the last drawing had data in 19 of 34",
        "panels, the others being vLLM's (no generator server in a local run) and the operator's (no `--operator`).",
        "",
    ]
    for d in DASHBOARDS:
        lines += [f"## {d.title} (`{d.uid}`)", "", d.description, "", "| panel | query | unit |", "|---|---|---|"]
        for p in d.panels:
            for t in p.targets:
                q = " ".join(t.expr.split()).replace("|", "\\|")
                lines.append(f"| {p.title} | `{q}` | {p.unit} |")
        lines.append("")
    return "\n".join(lines)


def outputs() -> dict[Path, str]:
    out = {OUT_DIR / d.file: json.dumps(render(d), indent=2, ensure_ascii=False) + "\n" for d in DASHBOARDS}
    out[DOC] = render_doc()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args()
    stale = []
    for path, text in outputs().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("stale, run `python hack/gen_dashboards.py`: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
