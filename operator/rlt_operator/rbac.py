"""The operator's Kubernetes permissions: exactly what it calls, verb by verb (least privilege).

The Helm chart's Role/ClusterRole must equal these (a chart test compares them), and
tests/operator/test_rbac.py checks that every request the operator makes during a full run
lifecycle is covered. Where each verb comes from:

- rltruns list/watch: Kopf's watch; patch: Kopf's finalizer and its progress annotations.
- rltruns/status patch: the reconcile loop writes status. rltruns/finalizers update: children carry
  ownerReferences with blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement admission
  plugin allows only to who may update the owner's finalizers.
- events create: Kopf posts the run's Events (core v1 API).
- children list/watch: Kopf indices (the operator never GETs single objects); create: fixed-name
  children; delete: gang restarts, suspend, terminal cleanup, TTL and run deletion; configmaps patch:
  the pods' run.yaml follows spec edits. Pods are only watched (generator restarts, failed ranks);
  deleting a Job or StatefulSet with Foreground propagation lets the garbage collector remove them.
- networkpolicies list/watch/create/delete: the policy that lets only a run's trainers reach its generators.
- customresourcedefinitions list/watch (cluster scope): Kopf's resource discovery.
  Namespaces are not needed unless `--namespace` is given a glob pattern (Kopf then watches them).
"""

from __future__ import annotations

from typing import Any

RBAC_RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": ["rlt.dev"], "resources": ["rltruns"], "verbs": ["list", "watch", "patch"]},
    {"apiGroups": ["rlt.dev"], "resources": ["rltruns/status"], "verbs": ["patch"]},
    {"apiGroups": ["rlt.dev"], "resources": ["rltruns/finalizers"], "verbs": ["update"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch", "create", "patch", "delete"]},
    {
        "apiGroups": [""],
        "resources": ["persistentvolumeclaims", "services"],
        "verbs": ["list", "watch", "create", "delete"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["list", "watch", "create", "delete"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["list", "watch", "create", "delete"]},
    {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["list", "watch", "create", "delete"],
    },
)
"""Namespaced rules: in a ClusterRole for `--all-namespaces`, or a Role per watched namespace."""

CLUSTER_RBAC_RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
)
"""Cluster-scoped rules, needed in both modes (a ClusterRole)."""


def allows(rules: tuple[dict[str, Any], ...], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)
