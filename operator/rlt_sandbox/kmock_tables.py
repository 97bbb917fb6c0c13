"""The server-side Tables kubectl prints (`kubectl get`): the printer columns of pods, Events and CRDs, and the
Table built from them. A mixin of kmock_glue.Cluster."""

from __future__ import annotations

import datetime
import itertools
from typing import Any

from kmock._internal import references, rendering

from rlt_sandbox.kmock_selectors import jsonpath

# The columns the API server prints for core Events (`kubectl get events`); "ref" joins kind/name.
EVENT_COLUMNS: list[dict[str, Any]] = [
    {"name": "Last Seen", "type": "date", "jsonPath": ".lastTimestamp"},
    {"name": "Type", "type": "string", "jsonPath": ".type"},
    {"name": "Reason", "type": "string", "jsonPath": ".reason"},
    {"name": "Object", "type": "string", "jsonPath": ".involvedObject", "ref": True},
    {"name": "Message", "type": "string", "jsonPath": ".message"},
]


def pod_status_text(pod: dict[str, Any]) -> str:
    """`kubectl get pods`' STATUS: the phase, refined by the init containers' progress (`Init:0/1`, `Init:Error`,
    `Init:ErrImagePull`) and then by the containers' waiting or terminated reason (`ImagePullBackOff`, `Error`)."""
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    text = status.get("reason") or status.get("phase") or "Pending"
    inits = status.get("initContainerStatuses") or []
    for i, c in enumerate(inits):
        state = c.get("state") or {}
        done = state.get("terminated")
        if done and done.get("exitCode") == 0:
            continue
        if done:
            return "Init:" + (done.get("reason") or f"ExitCode:{done.get('exitCode')}")
        waiting = (state.get("waiting") or {}).get("reason")
        if waiting and waiting != "PodInitializing":
            return f"Init:{waiting}"
        return f"Init:{i}/{len(inits)}"
    for c in reversed(status.get("containerStatuses") or []):
        state = c.get("state") or {}
        reason = (state.get("waiting") or {}).get("reason") or (state.get("terminated") or {}).get("reason")
        if reason:
            text = reason
    return str(text)


def _pod_ready(pod: dict[str, Any]) -> str:
    cs = (pod.get("status") or {}).get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or []) or len(cs)
    return f"{sum(bool(c.get('ready')) for c in cs)}/{total}"


def _pod_restarts(pod: dict[str, Any]) -> int:
    status = pod.get("status") or {}
    return sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or [])


# `kubectl get pods`: READY, STATUS as kubectl words it from the container states, RESTARTS and AGE.
POD_COLUMNS: list[dict[str, Any]] = [
    {"name": "Ready", "type": "string", "value": _pod_ready},
    {"name": "Status", "type": "string", "value": pod_status_text},
    {"name": "Restarts", "type": "integer", "value": _pod_restarts},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _age(ts: str | None) -> str:
    if not ts:
        return "<unknown>"
    try:  # the API's form, and Kopf's Event timestamps (microseconds, +00:00)
        t = datetime.datetime.fromisoformat(str(ts).replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.timezone.utc)
    s = int((datetime.datetime.now(tz=datetime.timezone.utc) - t).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{max(s, 0)}s"


class Tables:
    """The Table answers of kmock_glue.Cluster (its printer columns and resource versions)."""

    _rv: itertools.count[int]
    _printer_columns: dict[references.resource, list[dict[str, Any]]]

    def _wants_table(self, request: rendering.Request) -> bool:
        accept = request.headers.get("Accept", "") or request.headers.get("accept", "")
        return "as=Table" in accept and request.resource in self._printer_columns

    def _table(
        self, resource: references.resource, items: list[dict[str, Any]], definitions: bool = True
    ) -> dict[str, Any]:
        """The meta.k8s.io/v1 Table that kubectl prints for a custom resource (in a watch, only the first event
        carries the column definitions, as from the API server)."""
        cols = self._printer_columns[resource]
        defs = [{"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}]
        defs += [
            {
                "name": c["name"],
                "type": "string" if c.get("type") == "date" else c.get("type", "string"),
                "format": "",
                "description": c.get("description", ""),
                "priority": c.get("priority", 0),
            }
            for c in cols
        ]
        rows = []
        for obj in items:
            cells: list[Any] = [obj.get("metadata", {}).get("name")]
            for c in cols:
                value = c["value"](obj) if "value" in c else jsonpath(obj, c["jsonPath"])
                if c.get("ref") and isinstance(value, dict):
                    value = f"{str(value.get('kind', '')).lower()}/{value.get('name', '')}"
                if c.get("type") == "date":
                    value = _age(value)
                cells.append("" if value is None else value)
            rows.append(
                {
                    "cells": cells,
                    "object": {
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": obj.get("metadata", {}),
                    },
                }
            )
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": str(next(self._rv))},
            "columnDefinitions": defs if definitions else [],
            "rows": rows,
        }
