"""The operator's Kubernetes permissions: exactly what it calls, verb by verb (least privilege).

The Helm chart's Role/ClusterRole must equal these (a chart test compares them), and
tests/operator/test_rbac.py checks that every request the operator makes during a full run
lifecycle is covered. Where each verb comes from:

- rltruns list/watch: Kopf's watch; patch: Kopf's finalizer and its progress annotations.
- rltruns/status patch: the reconcile loop writes status. rltruns/finalizers update: children carry
  ownerReferences with blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement admission
  plugin allows only to who may update the owner's finalizers.
- events create, patch: the run's Events (core v1 API, rlt_operator.cluster.events): posted, and a recurring one's count
  patched; list: a Job's FailedCreate Events, and the Event an earlier operator process posted (a 409).
- children list/watch: Kopf indices, and a list by name after a 409 (whose object is it?) and by label at deletion
  (the operator never GETs single objects); create: fixed-name
  children; delete: gang restarts, suspend, terminal cleanup, TTL and run deletion; configmaps patch:
  the pods' run.yaml follows spec edits, and the copy of a failed pod's end that outlives the run (create, then
  patch: RUN-last-failure, rlt_operator.apply.evidence). Pods are watched (generator restarts, failed ranks); deleting a Job or
  StatefulSet with Foreground propagation lets the garbage collector remove them. Pods patch: a failed gang's
  failed trainer pod is handed to the run before its Job is deleted (kept for its logs); delete: the one kept
  before, when a newer one is kept, and the kept one at the run's deletion; create: only with dryRun=All, the pod
  each Job and StatefulSet would make, so that pod-level admission is asked before any child is created (a
  dry-run needs the create verb; nothing is stored).
- networkpolicies list/watch/create/patch/delete: the policy that lets only a run's trainers reach its generators;
  patch: its rules follow the operator's scrapers (metrics.podMonitor.prometheusNamespaces) for a run already going.
- customresourcedefinitions list/watch (cluster scope): Kopf's resource discovery.
- clusterkopfpeerings (cluster mode) or kopfpeerings (namespaced mode, in each watched namespace) list/watch/patch:
  Kopf's peering between replicas (rlt_operator.cluster.peering): it watches the peering object and merge-patches its own
  keep-alive into it. Only with peering on (the chart's default); the chart creates the objects.
- leases get/create/update (coordination.k8s.io, in the operator's own namespace): the replicas' leader Lease
  (rlt_operator.cluster.leader): read, created once, renewed and released by a conditional replace; get and update on
  that one Lease only (resourceNames). Only with peering on.
  Namespaces are not needed unless `--namespace` is given a glob pattern (Kopf then watches them).
"""

from __future__ import annotations

import json
import re
from typing import Any

from rlt_operator.builders.common import JOB_INDEX_ANNOTATION, L_ROLE, L_RUN
from rlt_operator.config.kinds import CHILDREN, CLUSTER_PEERING, EVENTS, LEASE, PEERING, RUN, Kind


def _rule(group: str, resources: list[str], verbs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": resources, "verbs": list(verbs)}


def _kind_rules(kinds: tuple[Kind, ...]) -> list[dict[str, Any]]:
    """One rule per (group, verbs), its resources in table order."""
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for k in kinds:
        grouped.setdefault((k.group, k.verbs), []).append(k.plural)
    return [_rule(group, plurals, verbs) for (group, verbs), plurals in grouped.items()]


RBAC_RULES: tuple[dict[str, Any], ...] = (
    _rule(RUN.group, [RUN.plural], RUN.verbs),
    _rule(RUN.group, [f"{RUN.plural}/status"], ["patch"]),
    _rule(RUN.group, [f"{RUN.plural}/finalizers"], ["update"]),
    *_kind_rules((EVENTS,)),
    *_kind_rules(CHILDREN),
)
"""Namespaced rules: in a ClusterRole for `--all-namespaces`, or a Role per watched namespace."""

CLUSTER_RBAC_RULES: tuple[dict[str, Any], ...] = (
    _rule("apiextensions.k8s.io", ["customresourcedefinitions"], ["list", "watch"]),
)
"""Cluster-scoped rules, needed in both modes (a ClusterRole)."""


PEERING_RULES: tuple[dict[str, Any], ...] = tuple(_kind_rules((PEERING,)))
"""Peering in namespaced mode: in the Role of each watched namespace, next to RBAC_RULES."""

CLUSTER_PEERING_RULES: tuple[dict[str, Any], ...] = tuple(_kind_rules((CLUSTER_PEERING,)))
"""Peering in cluster mode: in the cluster-scoped ClusterRole, next to CLUSTER_RBAC_RULES."""


def lease_rules(name: str) -> tuple[dict[str, Any], ...]:
    """The leader Lease `name` (named as the peering object), in both modes: a Role in the operator's own namespace
    (with peering on). get and update are granted on that Lease alone; create cannot be narrowed to a name (the
    API server authorizes a create before the object exists), so it is granted on leases of the namespace."""
    named = [v for v in LEASE.verbs if v != "create"]
    return (
        _rule(LEASE.group, [LEASE.plural], ["create"]),
        {**_rule(LEASE.group, [LEASE.plural], named), "resourceNames": [name]},
    )


# The chart's Role names the Lease as its Deployment names the peering (--peering).
CHART_LEASE_NAME = '{{ include "rlt-operator.peeringName" . }}'
LEASE_RULES: tuple[dict[str, Any], ...] = lease_rules(CHART_LEASE_NAME)
"""The chart's leader-Lease rules (the name a template the chart fills in)."""


EDITOR_RULES: tuple[dict[str, Any], ...] = (
    _rule(RUN.group, [RUN.plural], ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]),
    _rule(RUN.group, [f"{RUN.plural}/status"], ["get"]),
)
"""Users' rules, not the operator's: what the chart aggregates into the built-in `edit` and `admin` roles."""

VIEWER_RULES: tuple[dict[str, Any], ...] = (
    _rule(RUN.group, [RUN.plural, f"{RUN.plural}/status"], ["get", "list", "watch"]),
)
"""Users' rules: what the chart aggregates into the built-in `view` role."""


# Names other chart templates spell (NOTES, PodMonitor), from the same code. Prometheus turns a pod label into
# `__meta_kubernetes_pod_label_<name>` with every character outside [a-zA-Z0-9_] replaced by `_`.
def _pod_meta(kind: str, key: str) -> str:
    """How Kubernetes service discovery names a pod's label or annotation `key` for the PodMonitor's relabelings."""
    return f"__meta_kubernetes_pod_{kind}_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


CHART_NAMES: dict[str, str] = {
    "crdName": f"{RUN.plural}.{RUN.group}",
    "runLabel": L_RUN,
    "roleLabel": L_ROLE,
    "runLabelMeta": _pod_meta("label", L_RUN),
    "roleLabelMeta": _pod_meta("label", L_ROLE),
    # a trainer pod's completion index: the PodMonitor scrapes only index 0, where global rank 0 serves /metrics
    "jobIndexMeta": _pod_meta("annotation", JOB_INDEX_ANNOTATION),
    # the metrics Service's label whose value is the ServiceMonitor's job: "rlt-operator" whatever nameOverride says
    "jobLabel": f"{RUN.group}/job",
}


def allows(rules: tuple[dict[str, Any], ...], group: str, resource: str, verb: str, name: str | None = None) -> bool:
    """Whether `rules` grant `verb` on `resource` (the object `name`, if one): a rule with resourceNames grants only
    a request for one of those names."""
    return any(
        group in r["apiGroups"]
        and resource in r["resources"]
        and verb in r["verbs"]
        and ("resourceNames" not in r or name in r["resourceNames"])
        for r in rules
    )


def _yaml_rules(rules: tuple[dict[str, Any], ...]) -> str:
    def quote(name: str) -> str:  # a chart template (`{{ include ... }}`) is filled in by helm, then quoted
        template = re.fullmatch(r"\{\{(.*?)\}\}", name.strip())
        return f"{{{{{template.group(1).rstrip()} | quote }}}}" if template else json.dumps(name)

    def names(r: dict[str, Any]) -> str:
        quoted = (quote(n) for n in r["resourceNames"])
        return f"\n  resourceNames: [{', '.join(quoted)}]"

    return "\n".join(
        f"- apiGroups: {json.dumps(r['apiGroups'])}\n  resources: {json.dumps(r['resources'])}"
        f"{names(r) if 'resourceNames' in r else ''}\n  verbs: {json.dumps(r['verbs'])}"
        for r in rules
    )


def render_chart_rules() -> str:
    """The chart's `_rbac_rules.tpl`: the rules above as the two named templates its RBAC objects include."""
    names = "".join(f'{{{{- define "rlt-operator.{k}" -}}}}{v}{{{{- end }}}}\n' for k, v in CHART_NAMES.items())
    return (
        "{{/*\nGenerated by `make generate` from rlt_operator.cluster.rbac (rlt_operator.config.kinds, the run's labels of\n"
        "rlt_operator.builders); do not edit (a test compares it). docs/operator.md and the chart README explain where\n"
        "each verb comes from.\n*/}}\n\n"
        "{{/* Rules on namespaced resources: a ClusterRole in cluster mode, a Role per watched namespace otherwise. */}}\n"
        '{{- define "rlt-operator.namespacedRules" -}}\n'
        f"{_yaml_rules(RBAC_RULES)}\n"
        "{{- end }}\n\n"
        "{{/* Rules on cluster-scoped resources, needed in both modes (Kopf's resource discovery). */}}\n"
        '{{- define "rlt-operator.clusterRules" -}}\n'
        f"{_yaml_rules(CLUSTER_RBAC_RULES)}\n"
        "{{- end }}\n\n"
        "{{/* Kopf's peering between replicas, namespaced mode: a KopfPeering in each watched namespace. */}}\n"
        '{{- define "rlt-operator.namespacedPeeringRules" -}}\n'
        f"{_yaml_rules(PEERING_RULES)}\n"
        "{{- end }}\n\n"
        "{{/* Kopf's peering between replicas, cluster mode: one ClusterKopfPeering. */}}\n"
        '{{- define "rlt-operator.clusterPeeringRules" -}}\n'
        f"{_yaml_rules(CLUSTER_PEERING_RULES)}\n"
        "{{- end }}\n\n"
        "{{/* The replicas' leader Lease: a Role in the operator's own namespace. */}}\n"
        '{{- define "rlt-operator.leaseRules" -}}\n'
        f"{_yaml_rules(LEASE_RULES)}\n"
        "{{- end }}\n\n"
        "{{/* Users' RLTRun rules, aggregated into the built-in edit/admin and view roles. */}}\n"
        '{{- define "rlt-operator.editorRules" -}}\n'
        f"{_yaml_rules(EDITOR_RULES)}\n"
        "{{- end }}\n"
        '{{- define "rlt-operator.viewerRules" -}}\n'
        f"{_yaml_rules(VIEWER_RULES)}\n"
        "{{- end }}\n\n"
        "{{/* Names the other templates spell: the RLTRun CRD, the labels of a run's pods (and Prometheus' names). */}}\n"
        f"{names}"
    )
