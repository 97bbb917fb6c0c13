"""`helm test <release>`: the chart's test pod (templates/tests/) asks the metrics Service for rlt's build series.

Its rendered command is executed here, with this machine's Python, against a real operator metrics registry served
by prometheus_client, against a Prometheus endpoint that is not the operator's, and against a closed port. The image
runs the same command in tests/operator/test_operator_image.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from chart_helpers import by_kind, one, render_set, template
from prometheus_client import CollectorRegistry, start_http_server
from suite_helpers import PYPROJECT_VERSION, free_port

from rlt.contract.metrics import TrainerMetrics
from rlt_operator.cluster.operator_metrics import OperatorMetrics

HOOK = "helm.sh/hook"


def helm_test_pod(docs: list[dict]) -> dict:
    found = [d for d in by_kind(docs, "Pod") if (d["metadata"].get("annotations") or {}).get(HOOK) == "test"]
    assert len(found) == 1, [d["metadata"]["name"] for d in found]
    return found[0]


def run_check(pod: dict, url: str) -> subprocess.CompletedProcess:
    """The test pod's command, its URL replaced by `url` (the Service's DNS name resolves in a cluster only)."""
    command = pod["spec"]["containers"][0]["command"]
    assert command[0] == "python", command
    return subprocess.run([sys.executable, *command[1:-1], url], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("values", ["defaults", "monitoring", "namespaced"])
def test_the_test_pod_asks_the_metrics_service_and_no_selector_of_the_release_picks_it(values):
    docs = render_set(values)
    pod = helm_test_pod(docs)
    service = one(docs, "Service")
    port = service["spec"]["ports"][0]["port"]
    url = f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{port}/metrics"
    assert pod["spec"]["containers"][0]["command"][-1] == url
    assert pod["metadata"]["namespace"] == service["metadata"]["namespace"]
    annotations = pod["metadata"]["annotations"]
    assert "hook-succeeded" in annotations["helm.sh/hook-delete-policy"], "a passed test leaves no pod behind"
    # A ReplicaSet adopts an orphan pod its selector matches: the test pod must match none of the release's.
    labels = pod["metadata"]["labels"]
    deployment = one(docs, "Deployment")
    selectors = [deployment["spec"]["selector"]["matchLabels"], service["spec"]["selector"]]
    selectors += [d["spec"]["selector"]["matchLabels"] for d in by_kind(docs, "PodDisruptionBudget")]
    for selector in selectors:
        assert not all(labels.get(k) == v for k, v in selector.items()), (selector, labels)
    # The operator pod's own security settings and image.
    operator = deployment["spec"]["template"]["spec"]
    assert pod["spec"]["securityContext"] == operator["securityContext"]
    assert pod["spec"]["containers"][0]["securityContext"] == operator["containers"][0]["securityContext"]
    assert pod["spec"]["containers"][0]["image"] == operator["containers"][0]["image"]
    assert pod["spec"]["automountServiceAccountToken"] is False  # it talks to no API server


def test_the_test_pod_goes_where_the_operators_pods_may_go():
    """Nodes reached only with a toleration, or picked by a nodeSelector: the test pod follows the operator's."""
    docs = template(
        "--set",
        "nodeSelector.pool=system",
        "--set",
        "tolerations[0].key=dedicated,tolerations[0].operator=Equal,tolerations[0].value=system,"
        "tolerations[0].effect=NoSchedule",
    )
    pod, operator = helm_test_pod(docs)["spec"], one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == operator["nodeSelector"] == {"pool": "system"}
    assert pod["tolerations"] == operator["tolerations"] and pod["tolerations"][0]["key"] == "dedicated"
    defaults = helm_test_pod(render_set("defaults"))["spec"]
    assert "nodeSelector" not in defaults and "tolerations" not in defaults


def test_no_test_pod_without_the_metrics_service():
    docs = template("--set", "metrics.service.enabled=false")
    assert not [d for d in docs if HOOK in (d["metadata"].get("annotations") or {})]


def test_the_test_pods_command_passes_on_the_operators_metrics_and_says_its_version():
    registry = CollectorRegistry()
    OperatorMetrics(registry)
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        done = run_check(helm_test_pod(render_set("defaults")), f"http://127.0.0.1:{port}/metrics")
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"http://127.0.0.1:{port}/metrics: rlt_operator_build_info{{"), done.stdout
    assert f'version="{PYPROJECT_VERSION}"' in done.stdout, done.stdout


def test_the_test_pods_command_fails_naming_what_answered_or_that_nothing_did():
    pod = helm_test_pod(render_set("defaults"))
    trainer = TrainerMetrics(run="tiny")  # a Prometheus endpoint, but a trainer's, not the operator's
    port = trainer.serve(0)
    done = run_check(pod, f"http://127.0.0.1:{port}/metrics")
    assert done.returncode == 1
    assert "answered, but without rlt_operator_build_info: not the rlt operator's /metrics" in done.stderr
    assert "Traceback" not in done.stderr

    closed = free_port()
    done = run_check(pod, f"http://127.0.0.1:{closed}/metrics")
    assert done.returncode == 1
    assert f"http://127.0.0.1:{closed}/metrics: no answer (" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
