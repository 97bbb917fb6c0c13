"""The cluster's refusals of a run's children and pods on the real kube-apiserver (rlt_operator.apply.dry_run, .admission,
.server_check): no half-created run, whatever refuses, and `rlt validate --server` telling "you may not" from
"invalid".

Each case puts one refusing object in a namespace of its own — a ResourceQuota of 0 PVCs, a LimitRange below the
run's pods, a GPU quota on pods (`requests.nvidia.com/gpu: 0`), a ValidatingAdmissionPolicy refusing Services — and
applies the tiny run: it is held (ChildrenValid=False, ChildRefused) with ZERO children created, the reason naming
the object that refused; `rlt validate --server` says the same (exit 1); once the object is removed the run's
children are created (the held check is repeated with back-off). Then a user bound only to the chart's
rltrun-editor role: `rlt validate --server` prints one NOT PERMITTED line, exit NO_PERMISSION (77), not INVALID.
Skipped without $KUBEBUILDER_ASSETS (tests/real_cluster/conftest.py); the same with kmock: tests/operator/
test_admission.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import skip_without_assets
from kube_env import RLT, running_operator
from suite_helpers import EXAMPLES
from suite_helpers import wait_for as suite_wait_for

skip_without_assets()

from rlt.contract.exitcodes import ExitCode  # noqa: E402
from rlt_operator.cluster import rbac  # noqa: E402

pytestmark = [pytest.mark.real_cluster, pytest.mark.xdist_group("real_cluster"), pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "manifests" / "crd" / "rltruns.rlt.dev.yaml"
NAMESPACES = ("adm-claims", "adm-limits", "adm-gpus", "adm-policy", "adm-editor")
# every kind the operator makes for a run (by its label), pods included
CHILD_KINDS = ("configmaps", "persistentvolumeclaims", "services", "jobs", "statefulsets", "networkpolicies", "pods")


def wait_for(probe, what: str, timeout: float = 90.0):
    return suite_wait_for(probe, what, seconds=timeout, every=0.5)


def tiny(name: str, namespace: str) -> dict:
    doc = yaml.safe_load((EXAMPLES / "rltrun-tiny.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"]["storage"] = {"retentionPolicy": "Delete"}
    return doc


@pytest.fixture(scope="module")
def server(cluster):
    """The RLTRun CRD (applied here when the chart's is not installed, removed again after) and the namespaces."""
    ours = cluster.ensure_crd(CRD, "rltruns.rlt.dev")
    for ns in NAMESPACES:
        cluster.create_namespace(ns)
    yield cluster
    if ours:
        cluster.kubectl("delete", "crd", "rltruns.rlt.dev", "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator(server, tmp_path_factory):
    work = tmp_path_factory.mktemp("admission-operator")
    args = [a for ns in NAMESPACES for a in ("--namespace", ns)]
    with running_operator(server.kubeconfig, args, work, "admission-test") as (proc, _):
        yield proc


def _get(cluster, *args: str) -> dict | None:
    r = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def _children_valid(cluster, run: str, ns: str) -> dict:
    st = (_get(cluster, "rltrun", run, "-n", ns) or {}).get("status") or {}
    return next((c for c in st.get("conditions") or [] if c["type"] == "ChildrenValid"), {})


def _made(cluster, run: str, ns: str) -> list[str]:
    out = []
    for kind in CHILD_KINDS:
        items = (_get(cluster, kind, "-n", ns, "-l", f"rlt.dev/run={run}") or {}).get("items") or []
        out += [f"{kind}/{i['metadata']['name']}" for i in items]
    return out


def _validate(cluster, doc: dict, folder: Path, kubeconfig: Path | None = None) -> subprocess.CompletedProcess:
    path = folder / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "KUBECONFIG": str(kubeconfig or cluster.kubeconfig)}
    cmd = [*RLT, "validate", "--no-data", "--no-plan", "--server", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def _vap_refusing_services(cluster, ns: str) -> None:
    """A ValidatingAdmissionPolicy (GA since 1.30) refusing every Service in `ns`: 422 Invalid (a validation's
    default reason), its one cause naming no field but the policy, which the run's condition names (ChildRefused)."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "no-services"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["services"]}
                ],
            },
            "validations": [{"expression": "false", "message": "no Services in this namespace"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "no-services"},
        "spec": {"policyName": "no-services", "validationActions": ["Deny"]},
    }
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([policy, binding]))
    probe = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "probe", "namespace": ns}}
    probe["spec"] = {"ports": [{"port": 80}]}

    def refused() -> bool:  # the policy takes effect a moment after it is created
        r = cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(probe), check=False)
        return r.returncode != 0 and "no Services in this namespace" in r.stderr

    wait_for(refused, "the admission policy in force", timeout=60)


def _quota(cluster, ns: str, name: str, hard: dict) -> None:
    doc = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": ns}}
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump({**doc, "spec": {"hard": hard}}))


def _limit_range(cluster, ns: str) -> None:
    """Pods of at most 2 CPUs and 2Gi: below the tiny run's trainer pod (4 CPUs and 48Gi, no CPU or memory limit).
    Of type Pod: a Container type's max would become the containers' default limit, below their requests, and
    the pod validator (422) would refuse it before the LimitRanger could (403)."""
    doc = {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "small", "namespace": ns}}
    doc["spec"] = {"limits": [{"type": "Pod", "max": {"cpu": "2", "memory": "2Gi"}}]}
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(doc))


# (namespace, make the refusing object, remove it, what the reason must start with)
CASES = [
    (
        "adm-claims",
        lambda c, ns: _quota(c, ns, "no-claims", {"persistentvolumeclaims": "0"}),
        lambda c, ns: c.kubectl("delete", "resourcequota", "no-claims", "-n", ns),
        "ResourceQuota no-claims, against spec.storage",
    ),
    (
        "adm-limits",
        _limit_range,
        lambda c, ns: c.kubectl("delete", "limitrange", "small", "-n", ns),
        "a LimitRange in namespace adm-limits",
    ),
    (
        "adm-gpus",
        lambda c, ns: _quota(c, ns, "no-gpus", {"requests.nvidia.com/gpu": "0"}),
        lambda c, ns: c.kubectl("delete", "resourcequota", "no-gpus", "-n", ns),
        "ResourceQuota no-gpus, against spec.resources.trainer.gpus",
    ),
    (
        "adm-policy",
        _vap_refusing_services,
        lambda c, ns: c.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", "no-services"),
        "ValidatingAdmissionPolicy no-services",
    ),
]


@pytest.mark.parametrize("ns, make, remove, named", CASES, ids=[c[0] for c in CASES])
def test_a_refusing_cluster_object_holds_the_run_with_nothing_created_until_it_goes(
    server, operator, tmp_path, ns, make, remove, named
):
    make(server, ns)
    doc = tiny("held", ns)
    online = _validate(server, doc, tmp_path)
    assert online.returncode == ExitCode.FAILED and named in online.stderr, online.stderr
    server.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(doc))
    cond = wait_for(
        lambda: (c := _children_valid(server, "held", ns)).get("status") == "False" and c, "ChildrenValid False"
    )
    assert cond["reason"] == "ChildRefused" and cond["message"].startswith(named), cond
    time.sleep(8)  # a few resyncs and back-off checks later: still nothing
    assert _made(server, "held", ns) == [], "a child was created beside a refusal"
    status = _get(server, "rltrun", "held", "-n", ns)["status"]
    assert status["reason"] == "ChildRefused" and status["phase"] == "Pending", status
    events = _get(server, "events", "-n", ns, "--field-selector", "involvedObject.name=held,reason=ChildRefused")
    assert events and events["items"] and named in events["items"][0]["message"]
    remove(server, ns)
    # the held check is repeated with back-off (2 s doubling, at most a minute): the children come
    wait_for(lambda: _get(server, "job", "held-sft", "-n", ns), "the Job, once the refusal is gone", timeout=150)
    cond = wait_for(lambda: (c := _children_valid(server, "held", ns)).get("status") == "True" and c, "recovered")
    assert "and their pods" in cond["message"]
    server.kubectl("delete", "rltrun", "held", "-n", ns)


def test_validate_server_as_an_rltrun_editor_says_you_may_not_in_one_line(server, tmp_path):
    """A ServiceAccount bound only to the chart's rltrun-editor rules (rlt_operator.cluster.rbac.EDITOR_RULES, which the
    chart's ClusterRole renders): it may create the RLTRun, not the children the check dry-runs."""
    ns = "adm-editor"
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole"}
    role |= {"metadata": {"name": "rlt-test-rltrun-editor"}, "rules": list(rbac.EDITOR_RULES)}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding"}
    binding |= {
        "metadata": {"name": "editor", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "rlt-test-rltrun-editor"},
        "subjects": [{"kind": "ServiceAccount", "name": "editor", "namespace": ns}],
    }
    server.kubectl("create", "serviceaccount", "editor", "-n", ns)
    server.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([role, binding]))
    token = server.kubectl("create", "token", "editor", "-n", ns, "--duration=1h").stdout.strip()
    kubeconfig = server.write_kubeconfig(tmp_path / "editor.kubeconfig", {"token": token})
    may = server.kubectl("auth", "can-i", "create", "rltruns.rlt.dev", "-n", ns, kubeconfig=kubeconfig, check=False)
    assert may.stdout.strip() == "yes", "the editor may create RLTRuns"
    r = _validate(server, tiny("edited", ns), tmp_path, kubeconfig)
    assert r.returncode == ExitCode.NO_PERMISSION, r.stderr
    assert "INVALID" not in r.stderr and r.stdout == "", r.stderr
    (line,) = r.stderr.splitlines()
    assert "NOT PERMITTED: you may not create configmaps, create persistentvolumeclaims, create services" in line
    assert "create jobs.batch, create pods in namespace adm-editor" in line and "create rltruns" not in line
