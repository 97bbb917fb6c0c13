"""rlt's statement of the pod validator's rules (rlt.spec.pod_rules) against the real kube-apiserver: each value of
the offline door's cases is put where the operator renders it (a trainer Job's pod template, from the builders) and
sent with --dry-run=server; the server must refuse exactly what `rlt validate` refuses. Runs after
test_real_cluster.py (file order), on the same control plane."""

from __future__ import annotations

import copy
import json

import pytest
from conftest import skip_without_assets
from suite_helpers import ROOT, deep_merge, tiny_doc

from rlt.checks.validation import run_problems
from rlt.spec.loading import SpecError, parse_run

skip_without_assets()

pytestmark = [pytest.mark.real_cluster, pytest.mark.xdist_group("real_cluster"), pytest.mark.timeout(900)]

NS = "default"


def _rlt_refuses(patch: dict) -> bool:
    doc = tiny_doc()
    deep_merge(doc["spec"], copy.deepcopy(patch))
    try:
        return bool(run_problems(parse_run(doc, "run.yaml")))
    except SpecError:
        return True


def _job(name: str) -> dict:
    from rlt_operator import builders as b

    run = parse_run(tiny_doc(), "run.yaml")
    job = b.trainer_job(b.RunRef(name=name, namespace=NS, uid="u"), run.spec, "sft", 0)
    job["metadata"].pop("ownerReferences", None)  # no RLTRun behind it here
    return job


def _server_refuses(cluster, job: dict) -> bool:
    r = cluster.kubectl("create", "--dry-run=server", "-o", "name", "-f", "-", stdin=json.dumps(job), check=False)
    assert r.returncode == 0 or "is invalid" in r.stderr, r.stderr  # refused by validation, not something else
    return r.returncode != 0


FIELD_REFS = [
    {"fieldPath": "spec.containers"},
    {"fieldPath": "metadata.labels"},
    {"fieldPath": "status.phase['x']"},
    {"fieldPath": "metadata.labels['bad key']"},
    {"fieldPath": "metadata.name", "apiVersion": "v2"},
    {"fieldPath": "metadata.name"},
    {"fieldPath": "metadata.host"},  # converted to spec.nodeName by the server, yet refused for env
    {"fieldPath": "status.podIPs"},
    {"fieldPath": "metadata.annotations['Example.com/Key']"},
]
RESOURCE_REFS = [
    {"resource": "limits.nvidia.com/gpu"},
    {"resource": "requests.storage"},
    {"resource": "limits.cpu", "divisor": "2"},
    {"resource": "requests.memory", "divisor": "1m"},
    {"resource": "limits.memory", "divisor": "3Mi"},
    {"resource": "limits.cpu", "divisor": "1000m"},
    {"resource": "requests.memory", "divisor": "1Gi"},
    {"resource": "limits.hugepages-2Mi"},
]


@pytest.mark.parametrize(
    "source", [{"fieldRef": r} for r in FIELD_REFS] + [{"resourceFieldRef": r} for r in RESOURCE_REFS], ids=str
)
def test_env_sources_the_server_and_rlt_agree(cluster, source):
    job = _job("env-case")
    job["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "X", "valueFrom": source})
    assert _server_refuses(cluster, job) == _rlt_refuses({"env": [{"name": "X", "valueFrom": source}]})


MATCH_FIELDS = [
    {"key": "metadata.labels", "operator": "In", "values": ["n1"]},
    {"key": "metadata.name", "operator": "Exists"},
    {"key": "metadata.name", "operator": "In", "values": ["a", "b"]},
    {"key": "metadata.name", "operator": "In", "values": ["Not_A_Node"]},
    {"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]},
]


@pytest.mark.parametrize("req", MATCH_FIELDS, ids=str)
def test_match_fields_the_server_and_rlt_agree(cluster, req):
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": [req]}]}
        }
    }
    job = _job("affinity-case")
    pod = job["spec"]["template"]["spec"]
    pod["affinity"] = {**pod.get("affinity", {}), **affinity}
    assert _server_refuses(cluster, job) == _rlt_refuses({"scheduling": {"affinity": affinity}})


@pytest.mark.parametrize(
    "name",
    ["kubernetes.io/foo", "example.kubernetes.io/foo", "requests.example.com/foo", "example.com/foo", "rdma/hca"],
)
def test_extended_resource_names_the_server_and_rlt_agree(cluster, name):
    job = _job("resource-case")
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    for kind in ("requests", "limits"):
        resources.setdefault(kind, {})[name] = "1"
    server = _server_refuses(cluster, job)
    ours = _rlt_refuses({"resources": {"trainer": {"extra": {name: "1"}}}})
    if "kubernetes.io/" in name:
        # the one intended difference: the server takes it, the scheduler never places the pod (rlt.spec.pod_rules)
        assert (server, ours) == (False, True)
    else:
        assert server == ours


@pytest.mark.parametrize(
    "meta",
    [
        {"generateName": "Tiny_"},
        {"generateName": "tiny-"},
        {"finalizers": ["example.com/ok", "not a name"]},
        {"finalizers": ["orphan", "foregroundDeletion"]},
        {"finalizers": ["example.com/keep"]},
    ],
    ids=str,
)
def test_run_metadata_the_server_and_rlt_agree(cluster, meta):
    # the CRD the chart installs (an earlier test's uninstall may have removed it)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "manifests" / "crd"))
    doc = tiny_doc()
    doc["metadata"].update(meta, namespace=NS)
    r = cluster.kubectl("create", "--dry-run=server", "-o", "name", "-f", "-", stdin=json.dumps(doc), check=False)
    try:
        parse_run(doc, "run.yaml")
        ours = False
    except SpecError:
        ours = True
    assert (r.returncode != 0) == ours, r.stderr
