"""What a reconcile decides (a Decision: the status, the child writes as Actions, the Events) and the Plan that
collects the writes against what is observed; shared by the steps of status.decide."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from rlt.contract.api import TERMINAL_PHASES, Phase
from rlt_operator.builders.common import A_CONFIG_HASH
from rlt_operator.status.conditions import set_condition
from rlt_operator.status.model import ConditionType, RLTRunStatus
from rlt_operator.status.observed import Observed

PENDING, RUNNING, SUSPENDED, SUCCEEDED, FAILED = (
    Phase.PENDING,
    Phase.RUNNING,
    Phase.SUSPENDED,
    Phase.SUCCEEDED,
    Phase.FAILED,
)
TERMINAL = TERMINAL_PHASES

# Seconds to re-check while something is expected to change soon (deletions finishing, restarts).
SOON = 2.0


@dataclass(frozen=True)
class Action:
    verb: str  # create | patch | delete
    plural: str
    name: str
    body: dict[str, Any] | None = None
    propagation: str = "Background"
    grace_seconds: int | None = None  # a delete's gracePeriodSeconds (None: the object's own)


@dataclass
class Decision:
    status: dict[str, Any]
    actions: list[Action]
    events: list[tuple[str, str, str]]  # (Normal|Warning, reason, message)
    requeue_after: float | None = None


def min_of(a: float | None, b_: float | None) -> float | None:
    vals = [v for v in (a, b_) if v is not None]
    return min(vals) if vals else None


class Plan:
    """Accumulates actions against what is observed, so nothing is created or deleted twice."""

    def __init__(self, observed: Observed):
        self.obs = observed
        self.actions: list[Action] = []

    def ensure(self, plural: str, manifest: dict[str, Any] | None) -> bool:
        """Create if absent; True when it exists already."""
        if manifest is None:
            return True
        name = manifest["metadata"]["name"]
        if name in getattr(self.obs, plural):
            return True
        self.actions.append(Action("create", plural, name, manifest))
        return False

    def keep_current(self, plural: str, manifest: dict[str, Any], field: str) -> None:
        """Create if absent; when the existing child's config hash is not the manifest's, merge-patch its `field`
        (`data`, `spec`) and the hash (the child is kept equal to what the spec, or the operator's settings, say now)."""
        if self.ensure(plural, manifest):
            name, annotations = manifest["metadata"]["name"], manifest["metadata"]["annotations"]
            if getattr(self.obs, plural)[name].get("configHash") != annotations[A_CONFIG_HASH]:
                update = {"metadata": {"annotations": annotations}, field: manifest[field]}
                self.actions.append(Action("patch", plural, name, update))

    def delete(self, plural: str, name: str, propagation: str = "Background", grace_seconds: int | None = None) -> None:
        child = self.obs.child(plural, name)
        queued = any(a.verb == "delete" and a.name == name and a.plural == plural for a in self.actions)
        # A pod being deleted already may be deleted again with a shorter grace period (the API server shortens it).
        again = grace_seconds is not None and plural == "pods"
        if child is not None and (again or not child.get("deleting")) and not queued:
            self.actions.append(Action("delete", plural, name, propagation=propagation, grace_seconds=grace_seconds))


def fail(run_status: RLTRunStatus, reason: str, message: str, now: dt.datetime) -> None:
    run_status.phase, run_status.reason, run_status.message = FAILED, reason, message
    run_status.conditions = run_status.conditions or []
    set_condition(run_status.conditions, ConditionType.FAILED, True, reason, message, now)
