"""The run's Events (issue 45, item 10): from rlt-operator, counted when they recur, not re-posted by a restarted
operator for a problem already reported. Against the kmock API server (tests/operator/op_harness.py)."""

from __future__ import annotations

import datetime as dt

import pytest
from op_harness import NS, PATHS, example

from rlt_operator.builders import RunRef
from rlt_operator.cluster.events import MAX_MESSAGE, event_body, event_name, short

pytestmark = pytest.mark.timeout(90)

PULL = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "ghcr.io/x/trainer:0"'}}
FORBIDDEN = 'Error creating: pods "tiny-sft-0-x" is forbidden: exceeded quota: gpus, requested: nvidia.com/gpu=1'


async def trainer_pod(harness, state: dict) -> None:
    """The trainer Job's pod (the template's labels) with one container in `state`, as the kubelet reports it."""
    job = await harness.wait_object("jobs", "tiny-sft")
    name = "tiny-sft-0-abcde"
    if await harness.get("pods", name) is None:
        labels = job["spec"]["template"]["metadata"]["labels"]
        meta = job["metadata"]
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"], "controller": True}
        body = {"metadata": {"name": name, "labels": labels, "ownerReferences": [owner]}, "spec": {"containers": []}}
        await harness.call("POST", PATHS["pods"].format(ns=NS), {"apiVersion": "v1", "kind": "Pod", **body})
    phase = "Running" if "running" in state else "Pending"
    await harness.set_status("pods", name, {"phase": phase, "containerStatuses": [{"name": "trainer", "state": state}]})


async def _warnings(harness, reason: str, count: int | None = None) -> list[dict]:
    async def found():
        evs = [e for e in await harness.events("tiny") if e["reason"] == reason]
        return evs if evs and (count is None or evs[0].get("count") == count) else None

    return await harness.wait(found, f"{reason} Event" + (f" with count {count}" if count else ""), timeout=20)


async def test_events_come_from_rlt_operator_and_a_recurring_problem_counts_on_one_event(harness):
    await harness.start_operator()
    await harness.create_run(example())
    await trainer_pod(harness, PULL)
    (ev,) = await _warnings(harness, "ImagePullBackOff")
    assert ev["source"]["component"] == "rlt-operator" and ev["reportingComponent"] == "rlt-operator"
    assert ev["involvedObject"]["kind"] == "RLTRun" and ev["count"] == 1 and ev["type"] == "Warning"
    await trainer_pod(harness, {"running": {}})
    await harness.wait_status("tiny", lambda s: s.get("phase") == "Running", "the pod runs")
    await trainer_pod(harness, PULL)  # the same problem again: the same Event, counted
    (again,) = await _warnings(harness, "ImagePullBackOff", count=2)
    assert again["metadata"]["name"] == ev["metadata"]["name"]
    assert again["lastTimestamp"] >= ev["lastTimestamp"]
    assert all(e["source"]["component"] == "rlt-operator" for e in await harness.events("tiny"))


async def test_a_restarted_operator_does_not_post_again_what_was_reported(harness):
    await harness.start_operator()
    await harness.create_run(example())
    job = await harness.wait_object("jobs", "tiny-sft")
    ref = {"kind": "Job", "name": "tiny-sft", "namespace": NS, "uid": job["metadata"]["uid"]}
    await harness.call(
        "POST",
        PATHS["events"].format(ns=NS),
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "tiny-sft.1", "namespace": NS},
            "involvedObject": ref,
            "reason": "FailedCreate",
            "message": FORBIDDEN,
            "type": "Warning",
            "source": {"component": "job-controller"},
            "lastTimestamp": "2026-01-01T00:00:00Z",
        },
    )
    (first,) = await _warnings(harness, "FailedCreate")
    before = {e["metadata"]["name"] for e in await harness.events("tiny")}
    await harness.stop_operator()
    tried = _failed_create_posts(harness)
    await harness.start_operator()  # its memory of what was reported is gone; the FailedCreate is still there
    await harness.wait(
        lambda: _failed_create_posts(harness) > tried,
        "the restarted operator tries to post the FailedCreate again",
        timeout=30,
    )
    after = [e for e in await harness.events("tiny") if e["reason"] == "FailedCreate"]
    assert [e["metadata"]["name"] for e in after] == [first["metadata"]["name"]] and after[0]["count"] == 1
    assert {e["metadata"]["name"] for e in await harness.events("tiny")} == before, "nothing re-posted"


def _failed_create_posts(harness) -> int:
    """The operator's POSTs of its FailedCreate Event so far (the test's own, the job-controller's, not counted)."""
    return sum(
        1
        for r in harness.cluster._requests
        if str(r.method.value) == "POST"
        and r.url.path.endswith("/events")
        and (r.data or {}).get("reason") == "FailedCreate"
        and (r.data or {}).get("involvedObject", {}).get("kind") == "RLTRun"
    )


def test_one_event_per_run_type_reason_and_message_and_a_long_message_is_cut():
    run, other = RunRef("tiny", NS, "u1"), RunRef("tiny", NS, "u2")
    name = event_name(run, "Warning", "ImagePullBackOff", "m")
    assert name == event_name(run, "Warning", "ImagePullBackOff", "m") and name.startswith("tiny.")
    assert name != event_name(other, "Warning", "ImagePullBackOff", "m"), "a new run of the same name: new Events"
    assert name != event_name(run, "Warning", "ErrImagePull", "m")
    cut = short("x" * 600 + "y" * 600)
    assert len(cut) == MAX_MESSAGE and cut.startswith("x") and cut.endswith("y") and "..." in cut
    body = event_body(run, "Normal", "Running", "m", dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), "pod-1")
    assert (body["count"], body["reportingInstance"], body["firstTimestamp"]) == (1, "pod-1", "2026-01-01T00:00:00Z")
