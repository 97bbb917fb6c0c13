"""High availability through Kopf's peering: several `rlt operator` replicas, one active, the others paused.

Kopf keeps one record per replica (its identity, priority and a keep-alive time) in the `status` of a peering
object: a ClusterKopfPeering for a cluster-wide operator, a KopfPeering in each watched namespace otherwise. A
replica that sees a live peer of higher priority pauses: it stops its watches and its per-run daemons. When the
active replica exits cleanly it drops its record (the standby resumes at once); when it dies (SIGKILL, lost node)
its record expires `lifetime` seconds after its last keep-alive, and the standby resumes then. Equal priorities
pause everyone (Kopf's own safety rule), hence `auto_priority`.

The peering CRDs are Kopf's; this module writes the minimal schema Kopf needs (kinds.PEERINGS), for the chart's
crds/ directory (`make generate`) and the emulated API.
"""

from __future__ import annotations

import datetime
import random
import time
from typing import TYPE_CHECKING, Any

import yaml

from rlt_operator.config.kinds import CLUSTER_PEERING, PEERING, Kind

if TYPE_CHECKING:
    from rlt_operator.cluster.kube import Kube


# A record is valid this long after its keep-alive (Kopf renews it 5-10 s before it expires): the longest a
# standby waits after the active replica died without a goodbye. Kopf's default is 60 s.
DEFAULT_LIFETIME = 20
# Start times in hundredths of a second since 2024 (2**36 of them: until 2045) and 16 random bits below them: 52
# bits, exact in JSON. A second is too coarse: two replicas started half a second apart would be ordered at random.
_EPOCH = 1_704_067_200  # 2024-01-01T00:00:00Z
_TICKS_PER_SECOND = 100
_TIME_BITS, _TIE_BITS = 36, 16


def auto_priority(now: float | None = None, rng: random.Random | None = None) -> int:
    """A priority that prefers the replica started first: a newcomer (rolling update, rescheduled pod) joins as
    the paused standby and never preempts a working replica, so no two replicas act at once while both live.
    Replicas started within the same 10 ms are ordered by 16 random bits (a tie, one in 65536, pauses both until
    one restarts: Kopf's rule for equal priorities). Below 2**53, so that JSON readers keep it exact."""
    ticks = int(((time.time() if now is None else now) - _EPOCH) * _TICKS_PER_SECOND)
    ticks = min(max(ticks, 0), 2**_TIME_BITS - 1)
    tie = (rng or random.SystemRandom()).getrandbits(_TIE_BITS)
    return int((2**_TIME_BITS - 1 - ticks) * 2**_TIE_BITS + tie)


def missing(kube: Kube, name: str, namespaces: list[str] | None) -> list[str]:
    """The peering objects `rlt operator --peering NAME` needs and the API lacks (None: cluster-wide), as
    `kind/name` or `kind/name in namespace`: without them Kopf keeps the replica paused, silently."""
    if namespaces is None:
        return [] if kube.names(CLUSTER_PEERING.plural, "", name) else [f"{CLUSTER_PEERING.kind}/{name}"]
    return [f"{PEERING.kind}/{name} in {ns}" for ns in namespaces if not kube.names(PEERING.plural, ns, name)]


def working(records: dict[str, Any], identity: str, priority: int, now: float | None = None) -> tuple[bool, str]:
    """Kopf's rule, read from a peering object's status (identity -> {priority, lifetime, lastseen}): a replica
    works while no other live record has a priority as high as its own. Returns (works, who works else)."""
    at = time.time() if now is None else now
    others = []
    for who, rec in records.items():
        if who == identity or not isinstance(rec, dict):
            continue
        try:
            seen = datetime.datetime.fromisoformat(str(rec.get("lastseen"))).timestamp()
        except ValueError:
            continue  # not a record Kopf wrote
        if seen + float(rec.get("lifetime", 60)) > at and int(rec.get("priority", 0)) >= priority:
            others.append(who)
    return (not others, ", ".join(sorted(others)))


# Every peering object the chart creates carries it (app.kubernetes.io/part-of: rlt): other installs' are found by it.
PART_OF = ("app.kubernetes.io/part-of", "rlt")


def overlapping(objects: list[dict[str, Any]], own: str, now: float | None = None) -> list[str]:
    """Names of other rlt installs' peering objects in the same scope with a live record: an install that works
    on the same runs as this one (every Event twice, status writes racing)."""
    out = []
    for obj in objects:
        name = obj["metadata"]["name"]
        if name != own and not working(obj.get("status") or {}, "", -(2**63), now)[0]:
            out.append(name)
    return out


def _seniority(obj: dict[str, Any]) -> tuple[str, str]:
    """Which install came first: its peering object's creationTimestamp (RFC 3339 in UTC, as the API server writes
    it: ordered as text), then its name (a tie within the same second)."""
    meta = obj.get("metadata") or {}
    return (str(meta.get("creationTimestamp") or "9999"), str(meta.get("name") or ""))


def yields_to(objects: list[dict[str, Any]], own: dict[str, Any], now: float | None = None) -> list[str]:
    """The other rlt installs in this scope that this install gives way to: those with a live replica whose peering
    object is older than its own (the install there first keeps working). Two installs reconciling the same runs
    would post every Event twice and race their status writes; with this rule one works and the other waits."""
    name = (own.get("metadata") or {}).get("name")
    live = set(overlapping(objects, str(name), now))
    return sorted(
        o["metadata"]["name"] for o in objects if o["metadata"]["name"] in live and _seniority(o) < _seniority(own)
    )


def _crd(kind: Kind) -> dict[str, Any]:
    scope = "Namespaced" if kind.namespaced else "Cluster"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{kind.plural}.{kind.group}"},
        "spec": {
            "group": kind.group,
            "scope": scope,
            "names": {"kind": kind.kind, "plural": kind.plural, "singular": kind.kind.lower()},
            "versions": [
                {
                    "name": kind.version,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                # identity -> {priority, lifetime, lastseen}, merge-patched by each replica
                                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            },
                        }
                    },
                }
            ],
        },
    }


def crds() -> list[dict[str, Any]]:
    """Kopf's two peering CRDs (kopf.dev/v1), with no status subresource: Kopf merge-patches the object itself."""
    return [_crd(CLUSTER_PEERING), _crd(PEERING)]


def render_chart_crds() -> str:
    head = (
        "# Generated by `make generate` from rlt_operator.cluster.peering; do not edit (a test compares it).\n"
        "# Kopf's peering CRDs (kopf.dev/v1): the operator replicas keep their keep-alives in a peering object.\n"
        "# In crds/ so that Helm installs them before the peering object of templates/peering.yaml; Helm never\n"
        "# upgrades nor deletes them, and other Kopf operators may share them.\n"
    )
    return head + "---\n".join(yaml.safe_dump(c, sort_keys=False) for c in crds())
