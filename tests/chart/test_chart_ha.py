"""Two operator replicas by default, made safe by Kopf's peering: the Deployment, its arguments, the peering objects
and CRDs, the PodDisruptionBudget, and the refusal of unpeered replicas (real helm)."""

from __future__ import annotations

import yaml
from chart_helpers import CHART, IMAGE, by_kind, helm, one, render_set, template

from rlt.cli import build_parser
from rlt_operator.cluster import peering
from rlt_operator.config.kinds import CLUSTER_PEERING, PEERING


def test_two_replicas_one_peering_by_default():
    docs = render_set("defaults")
    dep = one(docs, "Deployment")
    spec = dep["spec"]
    assert spec["replicas"] == 2
    # A new pod joins paused (the oldest replica works) before an old one leaves: never zero, never two working.
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    args = build_parser().parse_args(["operator", *spec["template"]["spec"]["containers"][0]["args"]])
    assert args.all_namespaces and args.peering == "rel-rlt-operator" and args.peering_lifetime == 20
    assert args.priority is None  # each replica derives its own (rlt_operator.cluster.peering.auto_priority)
    # SIGTERM: the operator's own bound on its shutdown ends it before the kubelet's SIGKILL (Kubernetes' 30 s).
    assert args.shutdown_timeout < spec["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    env = {e["name"]: e for e in spec["template"]["spec"]["containers"][0]["env"]}
    assert env["POD_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # Kopf's peer identity
    anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    term = anti[0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    # The peering object the replicas share: cluster mode, a ClusterKopfPeering of that name.
    (obj,) = [d for d in docs if d["apiVersion"] == CLUSTER_PEERING.api_version]
    assert (obj["kind"], obj["metadata"]["name"]) == (CLUSTER_PEERING.kind, args.peering)
    assert "namespace" not in obj["metadata"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": spec["selector"]["matchLabels"]}}


def test_namespaced_mode_peers_in_each_watched_namespace():
    docs = render_set("namespaced")
    objs = [d for d in docs if d["apiVersion"] == PEERING.api_version]
    assert {d["kind"] for d in objs} == {PEERING.kind}
    assert sorted(d["metadata"]["namespace"] for d in objs) == ["team-a", "team-b"]
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(["operator", *c["args"]])
    assert args.namespace == ["team-a", "team-b"] and {d["metadata"]["name"] for d in objs} == {args.peering}


def test_peering_crds_are_generated_and_installed_first():
    assert (CHART / "crds" / "kopf-peerings.yaml").read_text() == peering.render_chart_crds(), "run `make generate`"
    out = helm("template", "rel", str(CHART), *IMAGE, "--include-crds").stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    crds = {d["metadata"]["name"]: d for d in by_kind(docs, "CustomResourceDefinition")}
    for kind in (CLUSTER_PEERING, PEERING):
        crd = crds[f"{kind.plural}.{kind.group}"]["spec"]
        assert crd["names"]["kind"] == kind.kind and crd["scope"] == ("Namespaced" if kind.namespaced else "Cluster")
        assert [v["name"] for v in crd["versions"]] == [kind.version]
        assert "subresources" not in crd["versions"][0]  # Kopf merge-patches the object itself (RBAC: patch)
    # Helm creates crds/ before any template, so the ClusterKopfPeering finds its kind.
    kinds = [d["kind"] for d in docs]
    assert kinds.index("CustomResourceDefinition") < kinds.index(CLUSTER_PEERING.kind)


def test_standalone_is_one_replica_recreate():
    docs = template("--set", "operator.peering.enabled=false", "--set", "operator.replicas=1")
    spec = one(docs, "Deployment")["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    assert build_parser().parse_args(["operator", *spec["template"]["spec"]["containers"][0]["args"]]).peering is None
    assert not by_kind(docs, "PodDisruptionBudget")
    assert "affinity" not in spec["template"]["spec"]


def test_unpeered_replicas_are_refused():
    proc = helm(
        "template", "rel", str(CHART), *IMAGE, "--set", "operator.peering.enabled=false", check=False
    )  # replicas stays 2
    assert proc.returncode != 0
    assert "operator.replicas > 1 needs operator.peering.enabled" in proc.stderr
