"""Day two in the sandbox: `helm upgrade --set …`, `helm rollback` and `kubectl apply` twice send strategic-merge
patches for built-in kinds; the changed value must land on the object and the rest of its lists must survive. Real
helm and kubectl binaries against the emulated API (not a cluster)."""

from __future__ import annotations

import json

import pytest
from suite_helpers import ROOT, find_tool

KUBECTL = find_tool("kubectl")
HELM = find_tool("helm")

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(KUBECTL is None or HELM is None, reason="kubectl/helm not installed"),
]

DEPLOY = "deployment/rlt-rlt-operator"


def _container(kubectl) -> dict:
    spec = json.loads(kubectl("get", DEPLOY, "-o", "json"))["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return container


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "<from>") for e in container["env"]}


def test_helm_upgrade_with_changed_values_and_rollback(start_sandbox):
    sandbox = start_sandbox()
    kubectl = sandbox.kubectl
    chart = ["rlt", str(ROOT / "charts/rlt-operator"), "--namespace", "default"]
    chart += ["--set", "image.repository=example.org/rlt-operator"]
    sandbox.run("helm", "install", *chart)
    before = _container(kubectl)
    assert _env(before)["RLT_OPERATOR_METRICS_PORT"] == "8080"

    upgrade = ["--set", "operator.metricsPort=9090", "--set", "operator.extraEnv[0].name=EXTRA"]
    upgrade += ["--set", "operator.extraEnv[0].value=yes", "--set", "operator.replicas=3"]
    sandbox.run("helm", "upgrade", *chart, *upgrade)
    after = _container(kubectl)
    env = _env(after)
    # the changed values land; every env entry the patch did not name survives (a merge patch would drop them)
    assert env["RLT_OPERATOR_METRICS_PORT"] == "9090" and env["EXTRA"] == "yes"
    assert env["POD_NAMESPACE"] == "<from>" and env["PYTHONDONTWRITEBYTECODE"] == "1"
    ports = {p["name"]: p["containerPort"] for p in after["ports"]}
    assert ports == {"metrics": 9090, "health": 8081}  # the old 8080 entry deleted by its merge key, not doubled
    assert after["volumeMounts"] == before["volumeMounts"] and after["image"] == before["image"]
    assert kubectl("get", DEPLOY, "-o", "jsonpath={.spec.replicas}") == "3"

    sandbox.run("helm", "rollback", "rlt", "1", "--namespace", "default")
    restored = _container(kubectl)
    assert _env(restored) == _env(before) and restored["ports"] == before["ports"]
    assert kubectl("get", DEPLOY, "-o", "jsonpath={.spec.replicas}") == "2"
    history = sandbox.run("helm", "history", "rlt", "--namespace", "default").stdout
    assert [line.split()[0] for line in history.splitlines()[1:]] == ["1", "2", "3"]
    assert "Rollback to 1" in history


DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
        - name: web
          image: example.org/web:1
          env:
            - {name: A, value: "1"}
            - {name: B, value: "2"}
          ports:
            - {containerPort: 80, name: http}
        - name: sidecar
          image: example.org/sidecar:1
"""


def test_kubectl_apply_twice_merges_by_key(start_sandbox):
    sandbox = start_sandbox()
    kubectl = sandbox.kubectl
    assert "deployment.apps/web created" in sandbox.run("kubectl", "apply", "-f", "-", input=DEPLOYMENT).stdout
    # someone adds an env entry by hand; a re-apply that does not name it must keep it (it is not in last-applied)
    kubectl("set", "env", "deployment/web", "-c", "web", "MANUAL=kept")
    changed = DEPLOYMENT.replace('{name: B, value: "2"}', '{name: B, value: "3"}').replace("sidecar:1", "sidecar:2")
    changed = changed.replace('            - {name: A, value: "1"}\n', "")
    out = sandbox.run("kubectl", "apply", "-f", "-", input=changed).stdout
    assert "deployment.apps/web configured" in out
    containers = json.loads(kubectl("get", "deployment/web", "-o", "json"))["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["web", "sidecar"]
    assert containers[1]["image"] == "example.org/sidecar:2"
    assert {e["name"]: e["value"] for e in containers[0]["env"]} == {"B": "3", "MANUAL": "kept"}  # A removed
    assert containers[0]["ports"] == [{"containerPort": 80, "name": "http"}]
