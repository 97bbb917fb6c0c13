"""What prometheus-operator makes of the chart's ServiceMonitor and PodMonitor: the scrape configs it writes for them,
and the targets Kubernetes service discovery would hand them. `rlt monitor` scrapes a local run and the sandbox's
operator through these, and the observability tests scrape with the same code.

Prometheus here (Debian's build) has no Kubernetes service discovery, so `file_sd` stands in for it, and only for it:
the targets carry the `__meta_kubernetes_*` labels discovery would give them (`pod_targets`, `service_targets`), and
which are scraped, with which labels, is decided by Prometheus from the chart's objects (selectors -> `keep`
relabelings, named ports, honorLabels, jobLabel, the objects' own relabelings).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any


def meta_name(label: str) -> str:
    """How Kubernetes service discovery spells a label in its meta labels."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def selector_relabelings(selector: dict[str, Any], role: str = "pod") -> list[dict[str, Any]]:
    """The `keep`/`drop` rules prometheus-operator makes of a label selector (on pod or service labels)."""
    rules = []
    prefix = f"__meta_kubernetes_{role}"
    for key, value in (selector.get("matchLabels") or {}).items():
        name = meta_name(key)
        rules.append(
            {
                "action": "keep",
                "source_labels": [f"{prefix}_label_{name}", f"{prefix}_labelpresent_{name}"],
                "regex": f"({re.escape(value)});true",
            }
        )
    for expr in selector.get("matchExpressions") or []:
        name = meta_name(expr["key"])
        label, present = f"{prefix}_label_{name}", f"{prefix}_labelpresent_{name}"
        values = "|".join(re.escape(v) for v in expr.get("values") or [])
        op = expr["operator"]
        if op == "In":
            rules.append({"action": "keep", "source_labels": [label, present], "regex": f"({values});true"})
        elif op == "NotIn":
            rules.append({"action": "drop", "source_labels": [label, present], "regex": f"({values});true"})
        elif op == "Exists":
            rules.append({"action": "keep", "source_labels": [present], "regex": "true"})
        elif op == "DoesNotExist":
            rules.append({"action": "drop", "source_labels": [present], "regex": "true"})
        else:
            raise ValueError(f"selector operator {op!r} is not a Kubernetes one")
    return rules


def snake(relabeling: dict[str, Any]) -> dict[str, Any]:
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {keys.get(k, k): v for k, v in relabeling.items()}


def _namespace_keep(spec: dict[str, Any]) -> list[dict[str, Any]]:
    names = (spec.get("namespaceSelector") or {}).get("matchNames")
    if not names:
        return []
    return [{"action": "keep", "source_labels": ["__meta_kubernetes_namespace"], "regex": "|".join(names)}]


def podmonitor_scrape_configs(pm: dict[str, Any], sd_file: Path) -> list[dict[str, Any]]:
    """One scrape config per podMetricsEndpoint, as prometheus-operator writes it (kubernetes_sd → file_sd)."""
    spec = pm["spec"]
    configs = []
    for i, ep in enumerate(spec["podMetricsEndpoints"]):
        relabel = selector_relabelings(spec["selector"]) + _namespace_keep(spec)
        relabel.append(
            {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": ep["port"]}
        )
        relabel += [
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        ]
        relabel += [snake(r) for r in ep.get("relabelings") or []]
        configs.append(
            {
                "job_name": f"podMonitor/{pm['metadata']['namespace']}/{pm['metadata']['name']}/{i}",
                "honor_labels": bool(ep.get("honorLabels", False)),
                "metrics_path": ep.get("path", "/metrics"),
                "scrape_interval": ep["interval"],
                "scrape_timeout": ep["scrapeTimeout"],
                "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": "1s"}],
                "relabel_configs": relabel,
            }
        )
    return configs


def servicemonitor_scrape_configs(sm: dict[str, Any], sd_file: Path, interval: str = "") -> list[dict[str, Any]]:
    """One scrape config per ServiceMonitor endpoint (the `endpoints` role): the service selector, the endpoint's
    port name, the namespace/service/pod/container/endpoint target labels, `job` from the service name or the
    jobLabel, honorLabels, the endpoint's relabelings. `interval` overrides the endpoint's (short tests)."""
    spec = sm["spec"]
    configs = []
    for i, ep in enumerate(spec["endpoints"]):
        relabel = selector_relabelings(spec["selector"], role="service") + _namespace_keep(spec)
        relabel.append(
            {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": ep["port"]}
        )
        relabel += [
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
        ]
        if spec.get("jobLabel"):
            relabel.append(
                {
                    "source_labels": [f"__meta_kubernetes_service_label_{meta_name(spec['jobLabel'])}"],
                    "target_label": "job",
                    "regex": "(.+)",
                    "replacement": "${1}",
                }
            )
        relabel.append({"target_label": "endpoint", "replacement": ep["port"]})
        relabel += [snake(r) for r in ep.get("relabelings") or []]
        configs.append(
            {
                "job_name": f"serviceMonitor/{sm['metadata']['namespace']}/{sm['metadata']['name']}/{i}",
                "honor_labels": bool(ep.get("honorLabels", False)),
                "metrics_path": ep.get("path", "/metrics"),
                "scrape_interval": interval or ep["interval"],
                "scrape_timeout": interval or ep["scrapeTimeout"],
                "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": "1s"}],
                "relabel_configs": relabel,
            }
        )
    return configs


def pod_targets(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Kubernetes service discovery's `pod` role: one target per container port, with the pod's meta labels (its
    labels and annotations among them)."""
    groups = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            continue  # discovery has no address for a pod without an IP
        meta = pod["metadata"]
        base = {
            "__meta_kubernetes_namespace": meta["namespace"],
            "__meta_kubernetes_pod_name": meta["name"],
            "__meta_kubernetes_pod_phase": (pod.get("status") or {}).get("phase", ""),
        }
        for kind, pairs in (("label", meta.get("labels")), ("annotation", meta.get("annotations"))):
            for key, value in (pairs or {}).items():
                base[f"__meta_kubernetes_pod_{kind}_{meta_name(key)}"] = value
                base[f"__meta_kubernetes_pod_{kind}present_{meta_name(key)}"] = "true"
        for c in pod["spec"]["containers"]:
            for port in c.get("ports") or []:
                labels = {
                    **base,
                    "__meta_kubernetes_pod_container_name": c["name"],
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                }
                groups.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": labels})
    return groups


def service_targets(service: dict[str, Any], address: str, pod: str, container: str) -> list[dict[str, Any]]:
    """The `endpoints` role for one Service backed by one pod at `address`: a target per Service port, with the
    Service's labels and port names (what the ServiceMonitor selects on)."""
    meta = service["metadata"]
    base = {
        "__meta_kubernetes_namespace": meta["namespace"],
        "__meta_kubernetes_service_name": meta["name"],
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_container_name": container,
        "__meta_kubernetes_endpoint_ready": "true",
    }
    for key, value in (meta.get("labels") or {}).items():
        base[f"__meta_kubernetes_service_label_{meta_name(key)}"] = value
        base[f"__meta_kubernetes_service_labelpresent_{meta_name(key)}"] = "true"
    return [
        {"targets": [address], "labels": {**base, "__meta_kubernetes_endpoint_port_name": port.get("name", "")}}
        for port in service["spec"]["ports"]
    ]
