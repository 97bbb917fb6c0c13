"""The operator's settings: every environment variable it reads, read once when it starts.

`rlt operator` and the in-process operator (sandbox, tests) build `OperatorSettings.from_env()` and hand it to
Kopf in the root memo; the handlers read only this object. A bad value is an error naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

# Where rank 0 of a stage's Job serves /metrics: pod 0 through the headless Service.
DEFAULT_PROGRESS_URL = "http://{job}-0.{job}.{namespace}.svc:{port}/metrics"


@dataclass(frozen=True)
class OperatorSettings:
    resync_seconds: float = 30.0  # RLT_RESYNC_SECONDS: longest wait between two reconciles of a run
    progress_interval: float = 30.0  # RLT_PROGRESS_INTERVAL: shortest wait between two progress reads of a run
    debounce_seconds: float = 0.1  # RLT_DEBOUNCE_SECONDS: coalesces a burst of child events into one reconcile
    watch_server_timeout: float = 300.0  # RLT_WATCH_SERVER_TIMEOUT: watches end server-side and reconnect
    metrics_port: int = 8080  # RLT_OPERATOR_METRICS_PORT: /metrics (0: any free port, negative: off)
    metrics_addr: str = "0.0.0.0"  # RLT_OPERATOR_METRICS_ADDR
    health_port: int = 8081  # RLT_OPERATOR_HEALTH_PORT: /healthz of `rlt operator` (0 or negative: off)
    progress_url: str = DEFAULT_PROGRESS_URL  # RLT_PROGRESS_URL: template with {job} {run} {namespace} {stage} {port}
    # RLT_PROMETHEUS_NAMESPACES: comma-separated namespaces whose Prometheus pods may reach the generators' port 8000
    # (the chart's metrics.podMonitor.prometheusNamespaces); empty: none
    prometheus_namespaces: str = ""
    pod_id: str = ""  # POD_ID: this replica's pod name (the chart sets it), Kopf's peering record key
    pod_namespace: str = ""  # POD_NAMESPACE: the operator's own namespace (the chart sets it), its leader Lease's

    ENV: ClassVar[Mapping[str, str]] = {  # field -> environment variable
        "resync_seconds": "RLT_RESYNC_SECONDS",
        "progress_interval": "RLT_PROGRESS_INTERVAL",
        "debounce_seconds": "RLT_DEBOUNCE_SECONDS",
        "watch_server_timeout": "RLT_WATCH_SERVER_TIMEOUT",
        "metrics_port": "RLT_OPERATOR_METRICS_PORT",
        "metrics_addr": "RLT_OPERATOR_METRICS_ADDR",
        "health_port": "RLT_OPERATOR_HEALTH_PORT",
        "progress_url": "RLT_PROGRESS_URL",
        "prometheus_namespaces": "RLT_PROMETHEUS_NAMESPACES",
        "pod_id": "POD_ID",
        "pod_namespace": "POD_NAMESPACE",
    }

    @property
    def scrapers(self) -> tuple[str, ...]:
        """The namespaces of RLT_PROMETHEUS_NAMESPACES, in order."""
        return tuple(n.strip() for n in self.prometheus_namespaces.split(",") if n.strip())

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OperatorSettings:
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = environ.get(cls.ENV[f.name], "")
            if raw == "":
                continue  # unset or empty: the default
            kind: type = type(getattr(cls, f.name))  # the default's type: float, int or str
            try:
                values[f.name] = kind(raw)
            except ValueError:
                raise ValueError(
                    f"{cls.ENV[f.name]}={raw!r}: expected {'a number of seconds' if kind is float else 'an integer'}"
                ) from None
        return cls(**values)


def kubeconfig_path() -> str | None:
    """$KUBECONFIG as it is now (the Kubernetes client library reads it once, at its import): `rlt validate --server`
    and the sandbox's clients may set it after that. The one environment read outside OperatorSettings."""
    return os.environ.get("KUBECONFIG")
