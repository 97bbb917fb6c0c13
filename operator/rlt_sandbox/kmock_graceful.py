"""A pod DELETE that names `gracePeriodSeconds`, as the API server does it: the pod a kubelet runs is marked
(`deletionTimestamp` = now + the period, `deletionGracePeriodSeconds`) and stays until its kubelet has ended its
processes and deletes it; a second DELETE may shorten the period, never lengthen it. kmock deletes every object at
once, and the kubelet emulator then gives the pod its own terminationGracePeriodSeconds: that stays the behaviour
of a DELETE without the option (most of the emulator's callers), and of a pod no kubelet runs (not Running:
the API server deletes an unbound pod at once too). kmock removes a marked object without finalizers at once, so
the mark carries KUBELET_FINALIZER, the stand-in for the kubelet's final deletion: the kubelet emulator lifts it
once the pod's processes are gone."""

from __future__ import annotations

import datetime as dt
from typing import Any

from kmock._internal import rendering

from rlt.contract.layout import format_time

KUBELET_FINALIZER = "sandbox.rlt.dev/kubelet"


def graceful_pod_deletion(objects: Any, request: rendering.Request) -> dict[str, Any] | None:
    """The merge patch that marks the pod a DELETE `request` names for deletion (by its options, the body, or its
    query); None when the object goes at once (not a pod, no period named, a period of 0, a pod that does not run).
    `objects`: kmock's object store."""
    assert request.resource is not None  # _handle passes resource requests only
    key = (request.resource, request.namespace, request.name)
    current = objects[key] if request.resource.plural == "pods" and key in objects else None
    if current is None or current.deleted:
        return None
    pod = dict(current.raw)
    options = request.data if isinstance(request.data, dict) else {}
    raw = options.get("gracePeriodSeconds", request.params.get("gracePeriodSeconds"))
    if raw is None or int(raw) <= 0 or (pod.get("status") or {}).get("phase") != "Running":
        return None
    grace = int(raw)
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp") and int(meta.get("deletionGracePeriodSeconds", grace)) <= grace:
        return {}  # marked already, with a period no longer than this one
    at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=grace)
    finalizers = [*(meta.get("finalizers") or []), KUBELET_FINALIZER]
    return {
        "metadata": {
            "deletionTimestamp": format_time(at),
            "deletionGracePeriodSeconds": grace,
            "finalizers": finalizers,
        }
    }
