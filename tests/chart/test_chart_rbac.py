"""The chart grants exactly the operator's own RBAC needs (rlt_operator.cluster.rbac), in both modes, peering included."""

from __future__ import annotations

from chart_helpers import CHART, IMAGE, by_kind, helm, one, render_set, template
from suite_helpers import hack_module

from rlt_operator.cluster.rbac import CLUSTER_PEERING_RULES, CLUSTER_RBAC_RULES, PEERING_RULES, RBAC_RULES, lease_rules

CHART_RULES = hack_module("generate").CHART_RULES


def normalized(rules) -> list[dict]:
    keys = ("apiGroups", "resources", "resourceNames", "verbs")
    return [{k: list(r[k]) for k in keys if k in r} for r in rules]


def test_cluster_mode_rules_equal_the_operators():
    docs = render_set("defaults")
    rules = RBAC_RULES + CLUSTER_PEERING_RULES  # peering is on by default: a ClusterKopfPeering
    assert normalized(one(docs, "ClusterRole", "rlt-operator")["rules"]) == normalized(rules)
    assert normalized(one(docs, "ClusterRole", "-cluster")["rules"]) == normalized(CLUSTER_RBAC_RULES)
    binding = one(docs, "ClusterRoleBinding", "rlt-operator")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "rel-rlt-operator",
    }


def test_namespaced_mode_rules_equal_the_operators():
    docs = render_set("namespaced")
    for role in by_kind(docs, "Role"):
        if role["metadata"]["name"].endswith("-leader-election"):
            continue  # the Lease's Role: test_the_leader_lease_is_granted_in_the_release_namespace_only
        assert normalized(role["rules"]) == normalized(RBAC_RULES + PEERING_RULES), role["metadata"]["namespace"]
    (cluster_role,) = by_kind(docs, "ClusterRole")
    assert normalized(cluster_role["rules"]) == normalized(CLUSTER_RBAC_RULES)


def test_every_verb_the_operator_needs_is_granted_and_nothing_more():
    granted = {
        (g, res, v)
        for r in one(render_set("defaults"), "ClusterRole", "rlt-operator")["rules"]
        for g in r["apiGroups"]
        for res in r["resources"]
        for v in r["verbs"]
    }
    needed = {
        (g, res, v)
        for r in RBAC_RULES + CLUSTER_PEERING_RULES
        for g in r["apiGroups"]
        for res in r["resources"]
        for v in r["verbs"]
    }
    assert granted == needed
    # Least privilege: the operator never reads secrets, never touches RBAC or nodes.
    assert not {res for _, res, _ in granted} & {"secrets", "roles", "rolebindings", "nodes", "clusterroles"}


def peering_name(docs: list[dict]) -> str:
    """The --peering the chart's Deployment passes: the Kopf peering's name and the leader Lease's."""
    (container,) = one(docs, "Deployment", "rlt-operator")["spec"]["template"]["spec"]["containers"]
    (arg,) = [a for a in container["args"] if a.startswith("--peering=")]
    return arg.split("=", 1)[1]


def test_the_leader_lease_is_granted_in_the_release_namespace_only():
    """create on leases, get and update on the replicas' Lease alone (rlt_operator.cluster.leader, named as the
    peering), in a Role of the release namespace, in both modes; none without peering (one replica, no election)."""
    for values in ("defaults", "namespaced"):
        docs = render_set(values)
        role = one(docs, "Role", "-leader-election")
        assert normalized(role["rules"]) == normalized(lease_rules(peering_name(docs)))
        assert role["metadata"]["namespace"] == one(docs, "Deployment", "rlt-operator")["metadata"]["namespace"]
        binding = one(docs, "RoleBinding", "-leader-election")
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert lease_rules("rel-rlt-operator") == (
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "update"],
            "resourceNames": ["rel-rlt-operator"],
        },
    )
    docs = template("--set", "operator.peering.name=team-a")  # the Role follows a peering named by the user
    assert peering_name(docs) == "team-a"
    assert one(docs, "Role", "-leader-election")["rules"][1]["resourceNames"] == ["team-a"]


def test_a_peering_passed_as_an_extra_argument_is_refused_naming_the_value_to_set():
    """The Role grants the Lease named as operator.peering.name: a --peering in extraArgs (argparse keeps the last)
    would name another Lease, and every replica would be refused it. Other extra arguments render."""
    refused = helm("template", "rel", str(CHART), *IMAGE, "--set", "operator.extraArgs={--peering=other}", check=False)
    assert refused.returncode != 0 and "operator.peering.name" in refused.stderr, refused.stderr
    docs = template("--set", "operator.extraArgs={--peering-lifetime=30}")
    assert "--peering-lifetime=30" in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]


def test_a_glob_namespace_in_extra_arguments_runs_one_unpeered_replica_as_the_readme_says():
    """README: a glob --namespace goes through operator.extraArgs. `rlt operator` takes --namespace or
    --all-namespaces, not both (it would exit 2: a crash loop); and a --namespace operator peers through
    KopfPeerings the chart cannot create for a pattern, so peering must be off."""
    from rlt.cli import build_parser

    glob = ("--set", "operator.extraArgs={--namespace=team-*}", "--set", "rbac.create=false")
    refused = helm("template", "rel", str(CHART), *IMAGE, *glob, check=False)
    assert refused.returncode != 0 and "operator.peering.enabled=false" in refused.stderr, refused.stderr
    docs = template(*glob, "--set", "operator.peering.enabled=false", "--set", "operator.replicas=1")
    c = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(c["command"][1:] + c["args"])  # exits 2 on a conflict, as the pod would
    assert args.namespace == ["team-*"] and not args.all_namespaces


def test_the_charts_rules_are_generated_from_the_kind_table():
    """Adding a child kind is one entry in rlt_operator.config.kinds.CHILDREN: its rule reaches the chart's template (made
    by `make generate`), and the observed children, the watches and the API paths follow."""
    from dataclasses import fields

    from rlt_operator.cluster import rbac
    from rlt_operator.config.kinds import CHILDREN, Kind
    from rlt_operator.status.observed import Observed

    assert CHART_RULES.read_text() == rbac.render_chart_rules(), "run `make generate` and commit the result"
    granted = {(r["apiGroups"][0], res, tuple(r["verbs"])) for r in RBAC_RULES for res in r["resources"]}
    assert {(c.group, c.plural, c.verbs) for c in CHILDREN} <= granted
    assert [f.name for f in fields(Observed)] == [c.plural for c in CHILDREN]
    extra = Kind("example.dev", "v1", "widgets", "Widget", ("list", "watch"))
    assert "widgets" in rbac._yaml_rules(tuple(rbac._kind_rules((*CHILDREN, extra))))


def test_standalone_grants_no_peering():
    docs = template("--set", "operator.peering.enabled=false", "--set", "operator.replicas=1")
    assert normalized(one(docs, "ClusterRole", "rlt-operator")["rules"]) == normalized(RBAC_RULES)
    assert not [d for d in docs if d["apiVersion"].startswith("kopf.dev/")]
    assert not by_kind(docs, "Role"), "one replica: no leader Lease"


def test_templates_take_the_api_group_and_run_labels_from_the_code():
    """Only the generated files spell the API group (also the prefix of a run's labels): the other templates include
    its names from `_rbac_rules.tpl` (rlt_operator.cluster.rbac.CHART_NAMES), so the chart follows rlt.contract.api."""
    from rlt.contract.api import API_GROUP
    from rlt_operator.builders.common import L_ROLE, L_RUN
    from rlt_operator.cluster import rbac

    templates = CHART_RULES.parent
    spelled = sorted(
        str(p.relative_to(templates))
        for p in templates.rglob("*")  # tests/ too
        if p.is_file()
        and p != CHART_RULES
        and any(s in p.read_text() for s in (API_GROUP, API_GROUP.replace(".", "_")))
    )
    assert not spelled, f"{spelled} spell {API_GROUP!r}: include the names of _rbac_rules.tpl instead"

    docs = render_set("monitoring")
    assert one(docs, "ClusterRole", "-rltrun-editor")["rules"] == list(rbac.EDITOR_RULES)
    assert one(docs, "ClusterRole", "-rltrun-viewer")["rules"] == list(rbac.VIEWER_RULES)
    pm = one(docs, "PodMonitor")
    assert {e["key"] for e in pm["spec"]["selector"]["matchExpressions"]} == {L_RUN, L_ROLE}
    sources = {s for ep in pm["spec"]["podMetricsEndpoints"] for r in ep["relabelings"] for s in r["sourceLabels"]}
    assert sources == {rbac.CHART_NAMES[k] for k in ("runLabelMeta", "roleLabelMeta", "jobIndexMeta")}
    assert one(docs, "CustomResourceDefinition")["metadata"]["name"] == rbac.CHART_NAMES["crdName"]
