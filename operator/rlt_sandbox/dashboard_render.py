"""The chart's Grafana dashboards drawn as PNGs from a Prometheus, for a machine without Grafana: every panel's own
queries (the dashboard JSON is the one source), time series as lines over the window, stat and table panels as their
latest values. Grafana's variables become "every namespace / run" and `$__rate_interval` a fixed window."""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Series = tuple[str, list[float], list[float]]  # legend, times (s), values


def dashboards(folder: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def concrete(expr: str, rate_window: str) -> str:
    """A panel's query with Grafana's variables replaced: all namespaces and runs, a fixed rate window."""
    for name in ("namespace", "run"):
        expr = expr.replace(f"${{{name}}}", ".*").replace(f"${name}", ".*")
    return expr.replace("$__rate_interval", rate_window)


def legend(fmt: str | None, labels: dict[str, str]) -> str:
    """Grafana's legendFormat: `{{label}}` replaced by the series' label; without one, the labels themselves."""
    if fmt:
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)
    shown = {k: v for k, v in labels.items() if k != "__name__"}
    return ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or labels.get("__name__", "value")


def query(base: str, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/{path}?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - loopback only
            body = json.loads(r.read())
    except urllib.error.HTTPError as err:  # 400: the PromQL is bad; Prometheus says why
        raise ValueError(json.loads(err.read()).get("error", str(err))) from None
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def panel_series(base: str, panel: dict[str, Any], start: float, end: float, rate_window: str) -> list[Series]:
    """Every series of a panel's queries over [start, end] (a range query per target; instant targets too, so a
    stat panel shows its history where it has one)."""
    step = str(max(1, math.ceil((end - start) / 200)))
    out: list[Series] = []
    for target in panel.get("targets", []):
        expr = concrete(target["expr"], rate_window)
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": step}
        for res in query(base, "query_range", params):
            times = [float(t) - end for t, _ in res["values"]]
            values = [float(v) for _, v in res["values"]]
            out.append((legend(target.get("legendFormat"), res["metric"]), times, values))
    return out


@dataclass
class Drawn:
    """What one drawing of the dashboards gave: the PNGs, how many panels, and `dashboard / panel` of the empty ones
    with whose metrics they wait for."""

    paths: list[Path] = field(default_factory=list)
    panels: int = 0
    empty: list[str] = field(default_factory=list)


def draw_dashboard(
    base: str, dash: dict[str, Any], path: Path, window_s: float, rate_window: str, drawn: Drawn
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted(dash["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    cols = 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(13, 3.1 * rows), squeeze=False)
    end = time.time()
    for ax, panel in zip(axes.flat, panels, strict=False):
        series = panel_series(base, panel, end - window_s, end, rate_window)
        _draw_panel(ax, panel, series)
        drawn.panels += 1
        if not series:
            drawn.empty.append(f"{dash['title']} / {panel['title']} ({exporter(panel)})")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"{dash['title']} (every namespace and run; last {window_s / 60:.0f} min from {base})")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    drawn.paths.append(path)


# Which exporter a panel's series come from, by the names its queries read: a local run alone has no operator and,
# in-process, no vLLM server, so an empty panel says whose metrics it waits for.
OPERATOR_METRICS = re.compile(r"\b(rlt_run_[a-z_]+|rlt_operator_[a-z_]+|controller_runtime_[a-z_]+|up)\b")
NO_DATA_HINT = {
    "operator": "\n(the operator's metrics: rlt sandbox with\nRLT_OPERATOR_METRICS_PORT, then --operator)",
    "vllm": "\n(vLLM's own metrics: a generator server)",
}


def exporter(panel: dict[str, Any]) -> str:
    exprs = " ".join(t.get("expr", "") for t in panel.get("targets", []))
    names = set(re.findall(r"\b(rlt_[a-z0-9_]+|vllm:[a-z0-9_:]+|controller_runtime_[a-z_]+|up)\b", exprs))
    if names and all(n.startswith("vllm:") for n in names):
        return "vllm"
    if names and all(OPERATOR_METRICS.fullmatch(n) for n in names):
        return "operator"
    return "trainer"


def _draw_panel(ax: Any, panel: dict[str, Any], series: list[Series]) -> None:
    unit = ((panel.get("fieldConfig") or {}).get("defaults") or {}).get("unit", "")
    ax.set_title(panel["title"], fontsize=9)
    if not series:
        why = "no data yet" + NO_DATA_HINT.get(exporter(panel), "")
        ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="gray", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    if panel["type"] in ("stat", "table"):  # the latest value of each series, as Grafana shows them
        ax.axis("off")
        lines = [
            f"{name}: {values[-1]:.4g} {unit if unit not in ('short', 'none') else ''}" for name, _, values in series
        ]
        ax.text(0.02, 0.95, "\n".join(lines[:8]), va="top", fontsize=9, transform=ax.transAxes, family="monospace")
        return
    for name, times, values in series[:12]:
        ax.plot(times, values, label=name[:60])
    ax.set_xlabel("seconds before now", fontsize=7)
    if unit not in ("", "short", "none"):
        ax.set_ylabel(unit, fontsize=7)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="best")


def draw_all(base: str, folder: Path, out_dir: Path, window_s: float = 1800, rate_window: str = "1m") -> Drawn:
    """Every dashboard of `folder` drawn into `out_dir/<name>.png` from the Prometheus at `base`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = Drawn()
    for name, dash in dashboards(folder).items():
        draw_dashboard(base, dash, out_dir / f"{name}.png", window_s, rate_window, drawn)
    return drawn
