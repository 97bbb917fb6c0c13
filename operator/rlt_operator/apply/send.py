"""Sending a decision's child writes to the API server: create, patch, delete, each only to an object of the
run's (rlt_operator.apply.writes); a refused write becomes a problem on the run, with back-off."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rlt_operator import builders
from rlt_operator.apply.writes import ChildWrites, WriteProblem, conflict, owns_object, owns_pod, owns_summary, rejected
from rlt_operator.cluster.kube import KubeError
from rlt_operator.cluster.state import OperatorState
from rlt_operator.status.decision import Action
from rlt_operator.status.observed import Observed


async def apply(
    state: OperatorState,
    ref: builders.RunRef,
    observed: Observed,
    actions: list[Action],
    writes: ChildWrites,
    logger: Any,
) -> tuple[list[Action], list[WriteProblem]]:
    """Send the decision's writes, each only to an object of the run's (rlt_operator.apply.writes). A write the server
    refuses (4xx other than 404/409) or that meets someone else's object is not retried at once but becomes a
    problem with back-off, and the others go on. Returns the actions sent and the problems new or changed."""
    sent: list[Action] = []
    news: list[WriteProblem] = []
    now = time.monotonic()

    def problem(p: WriteProblem) -> None:
        if writes.failed(p, now):
            news.append(p)

    for a in actions:
        key = (a.plural, a.name)
        if not writes.due(key, now) or (a.verb == "create" and writes.blocked(a.plural)):
            continue
        child = observed.child(a.plural, a.name) if a.verb != "create" else None
        if child is not None and not _owned(ref, a.plural, child, observed):
            problem(conflict(a.plural, a.name, None))
            continue
        try:
            if a.verb == "create":
                assert a.body is not None, "a create carries the object it creates"
                existing = await asyncio.to_thread(state.kube.create, a.plural, ref.namespace, a.body)
                if existing is None:
                    logger.info(f"created {a.plural}/{a.name}")
                elif existing and not owns_object(ref, a.plural, existing):
                    problem(conflict(a.plural, a.name, existing))
                    continue
            elif a.verb == "patch":
                assert a.body is not None, "a patch carries its body"
                try:
                    await asyncio.to_thread(state.kube.patch, a.plural, ref.namespace, a.name, a.body)
                except KubeError as err:
                    if err.status != 404:
                        raise
                    logger.info(f"{a.plural}/{a.name} is gone; not updated")  # the next reconcile decides again
                    continue
                logger.info(f"updated {a.plural}/{a.name}")
            elif a.verb == "delete":
                deleted = await asyncio.to_thread(
                    state.kube.delete, a.plural, ref.namespace, a.name, a.propagation, grace_seconds=a.grace_seconds
                )
                if deleted:
                    logger.info(f"deleted {a.plural}/{a.name}")
            else:  # pragma: no cover - status.decide only emits these three
                raise ValueError(f"unknown action {a.verb}")
        except KubeError as err:
            if not err.refused:
                raise
            state.metrics.refused(a.plural, a.verb, err.server_reason)
            problem(rejected(a.verb, a.plural, a.name, err.status, err.server_message))
            continue
        writes.succeeded(key)
        sent.append(a)
    return sent, news


def _owned(ref: builders.RunRef, plural: str, child: dict[str, Any], observed: Observed) -> bool:
    if plural == "pods":  # its Job's or StatefulSet's, or kept for its logs
        return owns_pod(ref, child, [*observed.jobs.values(), *observed.statefulsets.values()])
    return owns_summary(ref, plural, child)


def observed_conflicts(ref: builders.RunRef, observed: Observed) -> list[WriteProblem]:
    """Run-wide children with the run's label but not the run's (an earlier run's leftovers, a copy): never used.
    The trainer Jobs and generators of an earlier run of the same name are status.decide's (it waits for them)."""
    out = []
    for plural in ("configmaps", "persistentvolumeclaims", "services", "networkpolicies"):
        for name, child in getattr(observed, plural).items():
            if not child.get("deleting") and not owns_summary(ref, plural, child):
                out.append(conflict(plural, name, None))
    return out
