"""The run's Kubernetes Events, posted as client-go's event recorder posts them.

- From `rlt-operator` (reportingComponent and source.component: the From column of `kubectl describe rlt`), not Kopf.
- One Event per run, type, reason and message: a recurrence adds to its `count` and moves its `lastTimestamp` (a
  pod whose image pull flips between ErrImagePull and ImagePullBackOff makes two Events with counts, not one per
  flip).
- A problem whose message names a new object at each recurrence (a Job's FailedCreate names the pod it could not
  create, a new one at each retry) is keyed by what it is about instead (`key`: the Job): one Event per Job, its
  count the number of failures seen, its message the latest.
- Its name is derived from that key, so a restarted operator that would report a problem again (its memory of what
  was reported is gone) meets the Event the process before it posted (409) and leaves it as it is: not re-posted.
  The API server expires Events (an hour by default); one reported after that is posted again.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

from rlt.contract.layout import format_time
from rlt_operator.builders import RunRef
from rlt_operator.cluster.kube import Kube, KubeError
from rlt_operator.config.kinds import RUN

COMPONENT = "rlt-operator"
MAX_MESSAGE = 1024  # what the API server's Event validation allows


def short(message: str) -> str:
    """The message, its middle cut out when it is longer than an Event may carry."""
    if len(message) <= MAX_MESSAGE:
        return message
    half = (MAX_MESSAGE - 3) // 2
    return message[:half] + "..." + message[-(MAX_MESSAGE - 3 - half) :]


def event_name(ref: RunRef, type_: str, reason: str, message: str) -> str:
    """One name per (run UID, type, reason, message): the same problem is the same Event, across restarts too."""
    digest = hashlib.sha256("\0".join((ref.uid, type_, reason, message)).encode()).hexdigest()[:16]
    return f"{ref.name[:200]}.{digest}"


def event_body(
    ref: RunRef, type_: str, reason: str, message: str, now: dt.datetime, instance: str, key: str | None = None
) -> dict[str, Any]:
    """A core v1 Event about the run (the legacy series fields count/firstTimestamp/lastTimestamp, as client-go's
    recorder writes them), named by its message or, when given, by `key`."""
    stamp = format_time(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name(ref, type_, reason, key or message), "namespace": ref.namespace},
        "involvedObject": {
            "apiVersion": f"{RUN.group}/{RUN.version}",
            "kind": RUN.kind,
            "name": ref.name,
            "namespace": ref.namespace,
            "uid": ref.uid,
        },
        "type": type_,
        "reason": reason,
        "message": message,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class Recorder:
    """Posts the runs' Events (synchronous: the handlers call it in a thread). Remembers, per Event it posted or
    counted, the count it last wrote."""

    def __init__(self, kube: Kube, instance: str):
        self.kube, self.instance = kube, instance
        self.counts: dict[tuple[str, str], int] = {}  # (namespace, Event name) -> count last written

    def record(
        self, ref: RunRef, type_: str, reason: str, message: str, now: dt.datetime, key: str | None = None
    ) -> bool:
        """Post the Event, or count one more of it. False when an earlier operator process posted it already (left
        as it is: a restart does not report a problem again). With `key`, one Event per key: a recurrence with
        another message counts on it and shows the new message."""
        message = short(message)
        body = event_body(ref, type_, reason, message, now, self.instance, key)
        name = body["metadata"]["name"]
        count = self.counts.get((ref.namespace, name))
        if count is not None:
            recur: dict[str, Any] = {"count": count + 1, "lastTimestamp": format_time(now)}
            if key is not None:
                recur["message"] = message
            try:
                self.kube.patch("events", ref.namespace, name, recur)
                self.counts[(ref.namespace, name)] = count + 1
                return True
            except KubeError as err:
                if err.status != 404:
                    raise
                # expired (the API server's Event TTL): posted anew below
        existing = self.kube.create("events", ref.namespace, body)
        if existing:  # the process before this one posted it
            self.counts[(ref.namespace, name)] = int(existing.get("count") or 1)
            return False
        self.counts[(ref.namespace, name)] = 1
        return True

    def forget(self, ref: RunRef) -> None:
        """A deleted run's Events are not counted on (its memory goes with it)."""
        prefix = f"{ref.name[:200]}."
        for key in [k for k in self.counts if k[0] == ref.namespace and k[1].startswith(prefix)]:
            del self.counts[key]
