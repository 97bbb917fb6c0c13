"""The child-write path's rules: which objects are the run's, what a refused write becomes, and when to retry it.

- Ownership: a child is the run's when its controller owner reference carries the run's UID. The one exception is
  the run's own volume claim kept by `storage.retentionPolicy: Retain`: it has no owner reference (the garbage
  collector would delete it with the run) and is the run's when it carries the run's name and data role labels
  (a new run of the same name reuses it, as documented); one created under `Delete` and kept under `Retain` loses
  its owner reference when the run is deleted (claim_disowned). Anything else with a child's name is someone else's: a
  create that meets it (409) becomes `NameConflict` naming it, and the operator never patches or deletes it.
- A write the API server refuses with a 4xx other than 404/409 (a 422 from an invalid pass-through field, a 403 from
  a quota or admission webhook) becomes a problem carrying the server's message; the reconcile goes on, the status
  is written, and the write is retried with exponential back-off (2 s doubling to a minute).
Pure: the handlers do the HTTP calls and keep one `ChildWrites` per run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlt_operator.builders.common import L_ROLE, L_RUN, ROLE_DATA, RunRef

BACKOFF_FIRST = 2.0
BACKOFF_CAP = 60.0
NAME_CONFLICT = "NameConflict"
REJECTED = "ChildRejected"
# Children whose pods would use a conflicting object (someone else's volume, ConfigMap or Service): none is created
# while the run has a NameConflict.
POD_MAKERS = ("jobs", "statefulsets")


@dataclass(frozen=True)
class WriteProblem:
    plural: str
    name: str
    reason: str  # NAME_CONFLICT or REJECTED
    message: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.plural, self.name)


def owns(ref: RunRef, plural: str, owner_uids: list[str], labels: dict[str, str]) -> bool:
    """Whether an object with these owner UIDs and labels is the run's (see the module's docstring)."""
    if ref.uid in owner_uids:
        return True
    retained_claim = plural == "persistentvolumeclaims" and not owner_uids
    return retained_claim and labels.get(L_RUN) == ref.name and labels.get(L_ROLE) == ROLE_DATA


def owns_object(ref: RunRef, plural: str, obj: dict[str, Any]) -> bool:
    meta = obj.get("metadata") or {}
    uids = [r.get("uid") for r in meta.get("ownerReferences") or []]
    return owns(ref, plural, [u for u in uids if u], dict(meta.get("labels") or {}))


def claim_disowned(ref: RunRef, claim: dict[str, Any]) -> dict[str, Any] | None:
    """The merge patch that takes the run's owner reference off its claim, kept at deletion (Retain) although created
    under Delete (the policy is read when the run goes); None when the claim has none. Conditional on the version read."""
    meta = claim.get("metadata") or {}
    refs = meta.get("ownerReferences") or []
    kept = [r for r in refs if r.get("uid") != ref.uid]
    if len(kept) == len(refs):
        return None
    return {"metadata": {"ownerReferences": kept, "resourceVersion": meta.get("resourceVersion")}}


def owns_summary(ref: RunRef, plural: str, summary: dict[str, Any]) -> bool:
    """The same, for an observed summary (observed.summarize keeps the controller owner's UID)."""
    return owns(ref, plural, [summary["owner"]] if summary.get("owner") else [], summary.get("labels") or {})


def owns_pod(ref: RunRef, pod: dict[str, Any], controllers: list[dict[str, Any]]) -> bool:
    """A pod (an observed summary) is the run's when its controller is the run (a failed pod kept for its logs) or
    one of the run's Jobs and StatefulSets (observed summaries, which carry their UID)."""
    ours = {c.get("uid") for c in controllers if owns_summary(ref, "jobs", c)} | {ref.uid}
    return bool(pod.get("owner")) and pod.get("owner") in ours


def conflict(plural: str, name: str, obj: dict[str, Any] | None) -> WriteProblem:
    meta = (obj or {}).get("metadata") or {}
    owners = [f"{r.get('kind')}/{r.get('name')}" for r in meta.get("ownerReferences") or []]
    whose = f"owned by {', '.join(owners)}" if owners else "not created by this run"
    return WriteProblem(
        plural,
        name,
        NAME_CONFLICT,
        f"{plural}/{name} already exists and is not this run's ({whose}): nothing is written into it and no pod "
        "starts until it is renamed or removed, or the run is renamed",
    )


def rejected(verb: str, plural: str, name: str, status: int, server_message: str) -> WriteProblem:
    return WriteProblem(plural, name, REJECTED, f"{verb} {plural}/{name} refused (HTTP {status}): {server_message}")


@dataclass
class ChildWrites:
    """One run's refused writes and their back-off (kept between reconciles, lost on restart by design: the
    status keeps the condition until the next attempt decides it again)."""

    problems: dict[tuple[str, str], WriteProblem] = field(default_factory=dict)
    attempts: dict[tuple[str, str], int] = field(default_factory=dict)
    next_try: dict[tuple[str, str], float] = field(default_factory=dict)

    def due(self, key: tuple[str, str], now: float) -> bool:
        return now >= self.next_try.get(key, 0.0)

    def blocked(self, plural: str) -> bool:
        """A pod-making child is not created while another child's name is taken by someone else."""
        return plural in POD_MAKERS and any(p.reason == NAME_CONFLICT for p in self.problems.values())

    def failed(self, problem: WriteProblem, now: float) -> bool:
        """Record a problem and back off; True when it is new or says something new (worth an Event)."""
        key = problem.key
        n = self.attempts.get(key, 0)
        self.attempts[key] = n + 1
        self.next_try[key] = now + min(BACKOFF_CAP, BACKOFF_FIRST * 2**n)
        new = self.problems.get(key) != problem
        self.problems[key] = problem
        return new

    def succeeded(self, key: tuple[str, str]) -> None:
        for d in (self.problems, self.attempts, self.next_try):
            d.pop(key, None)

    def forget_gone(self, wanted: set[tuple[str, str]]) -> None:
        """Drop problems of writes the run no longer asks for (a later stage, a fixed spec)."""
        for key in [k for k in self.problems if k not in wanted and self.problems[k].reason == REJECTED]:
            self.succeeded(key)

    def requeue(self, now: float) -> float | None:
        waits = [t - now for k, t in self.next_try.items() if k in self.problems]
        return max(0.05, min(waits)) if waits else None
