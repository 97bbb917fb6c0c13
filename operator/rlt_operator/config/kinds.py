"""Every kind the operator touches and what it does to each: the one table that the Kopf watches and indices
(handlers), the RBAC rules (rbac, and from them the chart's generated `_rbac_rules.tpl`), the API paths (kube), the
observed children (observed.Observed), the sandbox's kubelet emulator and the tests' harness read.

Adding a child kind is one entry in CHILDREN (and the code that builds or reads it).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlt.contract.api import API_GROUP, API_VERSION, KIND, PLURAL


@dataclass(frozen=True)
class Kind:
    group: str  # "" for the core API
    version: str
    plural: str
    kind: str
    verbs: tuple[str, ...]  # what the operator does with it: exactly its RBAC verbs
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        """As a manifest's apiVersion: `apps/v1`, or `v1` for the core API."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def collection_path(self, namespace: str) -> str:
        """The REST path of the kind's objects in `namespace` (a `{ns}` placeholder works too)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return f"{base}/namespaces/{namespace}/{self.plural}" if self.namespaced else f"{base}/{self.plural}"


_WRITE = ("list", "watch", "create", "delete")

# The run's children: watched (server-side filtered on the run label), indexed, created and deleted by fixed name.
# Pods are their Job's or StatefulSet's; a failed gang's failed trainer pod is patched to be the run's (kept for its
# logs when its Job goes) and deleted when a newer one is kept or the run goes; a pod is created only with
# dryRun=All (nothing stored: pod-level admission is asked before any child exists, rlt_operator.apply.admission).
# ConfigMaps are patched too: the pods' run.yaml follows spec edits. The data claim is patched once, when a run
# created under retentionPolicy Delete is deleted under Retain: its owner reference goes, the claim stays.
CHILDREN: tuple[Kind, ...] = (
    Kind("", "v1", "configmaps", "ConfigMap", ("list", "watch", "create", "patch", "delete")),
    Kind("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", ("list", "watch", "create", "patch", "delete")),
    Kind("", "v1", "services", "Service", _WRITE),
    Kind("apps", "v1", "statefulsets", "StatefulSet", _WRITE),
    Kind("batch", "v1", "jobs", "Job", _WRITE),
    Kind("", "v1", "pods", "Pod", ("list", "watch", "create", "patch", "delete")),
    Kind("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", ("list", "watch", "create", "patch", "delete")),
)

# The RLTRun itself: Kopf's watch (list, watch) and its finalizer and progress annotations (patch).
RUN = Kind(API_GROUP, API_VERSION, PLURAL, KIND, ("list", "watch", "patch"))
# The run's Events (rlt_operator.cluster.events posts them, and patches the count of one that recurs); listed by
# involvedObject.uid: a Job's or StatefulSet's FailedCreate; list also after a 409 (the Event posted before).
EVENTS = Kind("", "v1", "events", "Event", ("create", "list", "patch"))

# Kopf's peering objects (rlt_operator.cluster.peering): the replicas' keep-alives, watched (list, watch) and merge-patched
# (patch) by Kopf. A cluster-wide operator peers in a ClusterKopfPeering, a namespaced one in a KopfPeering per
# watched namespace. The chart creates the objects; the operator recreates one that was deleted, never deletes one.
_PEER = ("list", "watch", "patch", "create")  # create: a deleted peering object is recreated (cluster/peering.py)
CLUSTER_PEERING = Kind("kopf.dev", "v1", "clusterkopfpeerings", "ClusterKopfPeering", _PEER, namespaced=False)
PEERING = Kind("kopf.dev", "v1", "kopfpeerings", "KopfPeering", _PEER)

# The leader Lease of the replicas (rlt_operator.cluster.leader), in the operator's own namespace: read, created once,
# renewed and released by a conditional replace (update).
LEASE = Kind("coordination.k8s.io", "v1", "leases", "Lease", ("get", "create", "update"))

BY_PLURAL: dict[str, Kind] = {k.plural: k for k in (*CHILDREN, RUN, EVENTS, CLUSTER_PEERING, PEERING, LEASE)}
CHILD_PLURALS: tuple[str, ...] = tuple(k.plural for k in CHILDREN)


def collection_path(plural: str, namespace: str) -> str:
    return BY_PLURAL[plural].collection_path(namespace)
