"""Pods that the Job or StatefulSet controller cannot create, and pods no scheduler has placed, show on the run.

A real Job controller that cannot create a pod (a missing PriorityClass or ServiceAccount, a ResourceQuota, a
LimitRange, an admission webhook) records only a FailedCreate Event on the Job; the Job's status stays at 0 active.
kmock has no controllers: the test posts the Event the controller would (tests/real_cluster/ sees the real one).
"""

from __future__ import annotations

import datetime as dt

import pytest
from op_harness import NS, PATHS, example

from rlt_operator import builders as b
from rlt_operator.status.conditions import pod_conditions
from rlt_operator.status.model import RLTRunStatus
from rlt_operator.status.observed import failed_create, summarize

pytestmark = pytest.mark.timeout(60)

FORBIDDEN = 'Error creating: pods "tiny-sft-0-abcde" is forbidden: no PriorityClass with name training-high was found'


async def test_a_jobs_failed_create_reaches_the_runs_condition_reason_and_events(harness):
    await harness.start_operator()
    await harness.create_run(example())
    job = await harness.wait_object("jobs", "tiny-sft")
    await harness.call(
        "POST",
        PATHS["events"].format(ns=NS),
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "tiny-sft.1", "namespace": NS},
            "involvedObject": {"kind": "Job", "name": "tiny-sft", "namespace": NS, "uid": job["metadata"]["uid"]},
            "reason": "FailedCreate",
            "message": FORBIDDEN,
            "type": "Warning",
            "source": {"component": "job-controller"},
            "lastTimestamp": "2026-01-01T00:00:00Z",
        },
    )

    def failed(st):
        c = {c["type"]: c for c in st.get("conditions") or []}.get("PodsSchedulable") or {}
        return c.get("status") == "False" and c.get("reason") == "FailedCreate"

    st = await harness.wait_status("tiny", failed, "PodsSchedulable=False FailedCreate", timeout=20)
    cond = {c["type"]: c for c in st["conditions"]}["PodsSchedulable"]
    assert cond["message"] == f"Job tiny-sft: {FORBIDDEN}"
    assert st["reason"] == "FailedCreate" and "no PriorityClass with name training-high" in st["message"]

    async def warned():
        return [e for e in await harness.events("tiny") if e["reason"] == "FailedCreate"] or None

    ev = await harness.wait(warned, "a FailedCreate Event on the run")
    assert ev[0]["type"] == "Warning" and FORBIDDEN in ev[0]["message"]

    await harness.trainer_running("tiny", "sft")  # the pods exist now: the condition goes
    await harness.wait_status("tiny", lambda s: not failed(s) and s.get("reason") != "FailedCreate", "cleared")


def test_the_newest_failed_create_wins():
    events = [
        {"reason": "FailedCreate", "message": "old", "lastTimestamp": "2026-01-01T00:00:00Z"},
        {"reason": "SuccessfulCreate", "message": "made", "lastTimestamp": "2026-01-01T00:00:09Z"},
        {"reason": "FailedCreate", "message": "new", "lastTimestamp": "2026-01-01T00:00:05Z"},
    ]
    assert failed_create("Job", "j", events) == {"reason": "FailedCreate", "message": "Job j: new", "about": "Job j"}
    assert failed_create("Job", "j", events[1:2]) is None


def _pod(spec, conditions=(), phase="Pending"):
    return summarize(
        "pods",
        {
            "metadata": {"name": "t-rl-0-x", "labels": b.labels("t", b.ROLE_TRAINER, "rl", 0)},
            "spec": spec,
            "status": {"phase": phase, "conditions": list(conditions)},
        },
    )


NOW = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize(
    "pod, expected",
    [
        (_pod({"schedulerName": "volcano"}), ("Unknown", "NotScheduled")),
        (_pod({}), ("Unknown", "NotScheduled")),
        (_pod({"nodeName": "gpu-1"}), ("True", "Scheduled")),
        (_pod({}, [{"type": "PodScheduled", "status": "True"}]), ("True", "Scheduled")),
        (_pod({}, phase="Running"), ("True", "Scheduled")),
    ],
    ids=["other scheduler, untouched", "default scheduler, untouched", "nodeName", "PodScheduled", "running"],
)
def test_pods_schedulable_is_true_only_for_scheduled_pods(pod, expected):
    st = RLTRunStatus()
    pod_conditions(st, [pod], NOW)
    cond = {c.type: c for c in st.conditions or []}["PodsSchedulable"]
    assert (cond.status, cond.reason) == expected, cond
    if pod.get("schedulerName"):
        assert "volcano" in (cond.message or "")
