"""Evidence that outlives the run: the failed trainer pod's end (its log's tail, exit code, reason) and the operator's
diagnosis, copied into a ConfigMap `RUN-last-failure` before the operator deletes anything of the failed gang.

The kept failed pod (status.lastFailedPod) and the Events go when the run is deleted or after an hour; this copy is
owned by nothing, so it survives `kubectl delete rlt RUN` (and a re-created run of the same name overwrites it at
its own first failure). It carries the label `rlt.dev/evidence-of: RUN`, not the run's `rlt.dev/run`, so the
operator never counts it as a child of a later run of that name. Delete it with
`kubectl -n NS delete configmap -l rlt.dev/evidence-of=RUN` (docs/alerts.md, RLTRunFailed).

The log tail is the container's termination message: the kubelet keeps the last 80 lines (at most 4 KiB) of the log
of a container that failed (terminationMessagePolicy FallbackToLogsOnError, set on every trainer), so the copy
needs no `pods/log` permission and works when the pod's node is gone.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from rlt_operator import builders

L_EVIDENCE_OF = f"{builders.PREFIX}/evidence-of"


class _Kube(Protocol):
    def create(self, plural: str, namespace: str, manifest: dict[str, Any]) -> dict[str, Any] | None: ...

    def patch(
        self, plural: str, namespace: str, name: str, body: dict[str, Any], subresource: str = ""
    ) -> dict[str, Any]: ...


class _Logger(Protocol):
    def info(self, msg: str) -> None: ...

    def warning(self, msg: str) -> None: ...


def evidence_name(run: str) -> str:
    return f"{run}-last-failure"


def manifest(ref: builders.RunRef, status: dict[str, Any], pod: dict[str, Any], now: str) -> dict[str, Any]:
    """The ConfigMap for the failed pod `pod` (an observed summary) of the run whose new status is `status`."""
    ended = pod.get("ended") or {}
    failed = status.get("phase") == "Failed"
    failure = (status.get("message") if failed else None) or status.get("lastFailure") or ""
    labels = pod.get("labels") or {}
    data = {
        "run": ref.name,
        "runUID": ref.uid,
        "outcome": f"run Failed ({status.get('reason')})" if failed else "gang restarted",
        "failure": failure,
        "stage": labels.get(builders.L_STAGE, ""),
        "gangRestart": labels.get(builders.L_RESTART, "0"),
        "pod": pod["name"],
        "node": pod.get("node") or "",
        "container": ended.get("container") or "",
        "exitCode": str(ended.get("exitCode") if ended.get("exitCode") is not None else pod.get("exitCode") or ""),
        "reason": ended.get("reason") or "",
        "finishedAt": ended.get("finishedAt") or "",
        "copiedAt": now,
        # the kubelet's copy of the log's last lines; empty when the container wrote nothing before it ended
        "log-tail": ended.get("message") or "",
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": evidence_name(ref.name),
            "labels": {L_EVIDENCE_OF: ref.name, "app.kubernetes.io/managed-by": "rlt-operator"},
        },
        "data": data,
    }


def copied_before(existing: dict[str, Any], ref: builders.RunRef, pod: str | None) -> bool:
    """Whether the evidence ConfigMap already holds this run's copy of this pod's end."""
    data = existing.get("data") or {}
    return data.get("runUID") == ref.uid and data.get("pod") == pod


async def keep(
    kube: _Kube,
    ref: builders.RunRef,
    status: dict[str, Any],
    pods: list[dict[str, Any]],
    copied: str | None,
    now: str,
    logger: _Logger,
) -> str | None:
    """Copy the end of status.lastFailedPod into the run's evidence ConfigMap unless `copied` (the pod copied last
    by this operator) is that pod already, or the ConfigMap holds this run's copy of it (an operator restarted: the
    same failure is not written again). Returns the pod now copied (or `copied` when nothing was): the caller
    remembers it. A refused write is logged and tried again at the next reconcile; a ConfigMap of that name that
    is not rlt's evidence of this run is never overwritten."""
    name = status.get("lastFailedPod")
    pod = next((p for p in pods if p["name"] == name), None) if name else None
    if pod is None or name == copied:
        return copied
    body = manifest(ref, status, pod, now)
    cm = body["metadata"]["name"]
    try:
        existing = await asyncio.to_thread(kube.create, "configmaps", ref.namespace, body)
        if existing:
            theirs = ((existing.get("metadata") or {}).get("labels") or {}).get(L_EVIDENCE_OF)
            if theirs != ref.name:
                logger.warning(f"configmap {cm} exists and is not rlt's evidence of {ref.name}: not overwritten")
                return name
            if copied_before(existing, ref, name):
                return name  # an earlier operator process copied this failure: once per failure, not per start
            await asyncio.to_thread(kube.patch, "configmaps", ref.namespace, cm, {"data": body["data"]})
    except Exception as err:  # noqa: BLE001 - evidence is auxiliary: said, retried, never fatal to the reconcile
        logger.warning(f"could not copy failed pod {name}'s end into configmap {cm}: {err}")
        return copied
    logger.info(f"copied failed pod {name}'s reason and log tail into configmap {cm} (kept after the run)")
    return name
