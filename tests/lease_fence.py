"""Was every write of the operator replicas sent by the leader Lease's holder of that moment? (rlt_operator.cluster.leader)

Shared by the emulated API's test (tests/operator/test_ha_lease.py, which reads kmock's request log) and the real
server's (tests/real_cluster/test_server_lease.py, which reads the kube-apiserver's audit log): each turns its log
into `Write`s, these functions judge them the same way.

A replica's leadership window opens when a write of the Lease naming it as holder has been answered and closes
when the server receives the next Lease write naming someone else (a takeover, or its own release, which names no
one). A write is fenced when it lies wholly inside a window of its sender: sent after the server answered that
replica's claim, answered before the server received another's claim. An ordered log (kmock's) has one position per
request (start == end), where this is "the last Lease write before it named its sender".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LEASES = "leases"


@dataclass(frozen=True)
class Write:
    """One write request of a replica, as a server log shows it."""

    start: float  # when the server received it (a log position or a timestamp)
    end: float  # when the server answered it (== start for an ordered log)
    who: str  # the replica that sent it (its kubeconfig's identity)
    verb: str  # create, update, patch, delete
    resource: str  # the plural, with "/subresource" if any
    name: str  # namespace/name (a create's name from its body)
    body: Any = None  # the request body (a patch as sent), where the log keeps it
    ok: bool = True  # the server applied it (2xx); an ordered log that keeps no answers says True


def kopf_bookkeeping(patch: Any) -> bool:
    """A patch that touches only Kopf's finalizer, annotations and the resourceVersion it tests."""
    if isinstance(patch, list):  # a JSON patch
        return all(op["path"] in ("/metadata/finalizers", "/metadata/resourceVersion") for op in patch)
    if not isinstance(patch, dict):
        return False
    meta = patch.get("metadata") or {}
    return set(patch) == {"metadata"} and set(meta) <= {"annotations", "resourceVersion", "finalizers"}


def holder_written(w: Write) -> str:
    """The holder a Lease write names: its sender for a claim or renewal, '' for a release."""
    return str(((w.body or {}).get("spec") or {}).get("holderIdentity") or "")


def lease_claims(writes: list[Write], lease: str) -> list[Write]:
    """The applied writes of the Lease `lease` (namespace/name), in the order the server received them."""
    return sorted((w for w in writes if w.resource == LEASES and w.ok and w.name == lease), key=lambda w: w.start)


def acts(w: Write) -> bool:
    """A write the fence covers: not the election's own Lease writes nor Kopf's peering keep-alives (a standby sends
    both: that is how it stands by), nor Kopf's own finalizer and annotations on a run (docs/decisions/leader-lease.md)."""
    if w.resource == LEASES or w.resource.startswith("kopfpeerings") or w.resource.startswith("clusterkopfpeerings"):
        return False
    return not (w.verb == "patch" and w.resource == "rltruns" and kopf_bookkeeping(w.body))


def unfenced_writes(writes: list[Write], lease: str) -> list[tuple[Write, str]]:
    """Every covered write not inside a leadership window of its sender, with the holder when it was sent."""
    claims = lease_claims(writes, lease)
    bad = []
    for w in writes:
        if not acts(w):
            continue
        answered = [c for c in claims if c.end <= w.start]
        holder = holder_written(answered[-1]) if answered else ""
        # a claim by another the server received before this write was answered: it may have been applied first
        racing = [c for c in claims if c.end > w.start and c.start < w.end and holder_written(c) != w.who]
        if holder != w.who or racing:
            bad.append((w, holder if holder != w.who else f"{holder}, then {holder_written(racing[0]) or 'none'}"))
    return bad


def turns(claims: list[Write]) -> list[str]:
    """The holders of the Lease in turn (consecutive renewals by one replica counted once; releases left out)."""
    out: list[str] = []
    for c in claims:
        h = holder_written(c)
        if h and (not out or out[-1] != h):
            out.append(h)
    return out


def windows(claims: list[Write], until: float) -> list[tuple[str, float, float]]:
    """(holder, from, to) of each leadership window: from the answer to the claim that named it to the receipt of
    the next Lease write naming another or no one (or `until`)."""
    out: list[tuple[str, float, float]] = []
    current, since = "", 0.0
    for c in claims:
        h = holder_written(c)
        if h == current:
            continue
        if current:
            out.append((current, since, c.start))
        current, since = h, c.end
    if current:
        out.append((current, since, until))
    return out
