"""The chart rendered for tests that scrape with a real Prometheus (importable as `monitor_scrape` from any test
module); the scrape configs prometheus-operator writes for its ServiceMonitor and PodMonitor come from
rlt_sandbox.prometheus_sd, the code `rlt monitor` uses.

The Debian build of Prometheus used here has no Kubernetes service discovery, so `file_sd` stands in for it, and only
for it: the targets carry the `__meta_kubernetes_*` labels discovery would give them (`pod_targets`,
`service_targets`), and which are scraped, with which labels, is decided by Prometheus from the chart's objects
(selectors → `keep` relabelings, named ports, honorLabels, jobLabel, the objects' own relabelings).
"""

from __future__ import annotations

from typing import Any

from suite_helpers import ROOT, TOOLS_BIN

from rlt_sandbox import monitoring
from rlt_sandbox.prometheus_sd import (  # noqa: F401 - re-exported for the tests
    pod_targets,
    podmonitor_scrape_configs,
    service_targets,
    servicemonitor_scrape_configs,
)

CHART = ROOT / "charts" / "rlt-operator"
RELEASE_NAMESPACE = "rlt-system"


def render_chart(*sets: str, namespace: str = RELEASE_NAMESPACE) -> list[dict[str, Any]]:
    """The chart rendered by the real helm with the CI monitoring values (monitoring API on) and `--set`s: the
    rendering `rlt monitor` uses."""
    return monitoring.render_chart(str(TOOLS_BIN / "helm"), *sets, chart=CHART, namespace=namespace)


def only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]
