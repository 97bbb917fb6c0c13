"""Watches of the emulated API at their time limit (issue 53, item 6): the sandbox's operator died 300 s after it
started because every watch reaching timeoutSeconds ended with a 500 instead of a clean end of the stream."""

from __future__ import annotations

import asyncio
import json

import pytest
from op_harness import example

from rlt_operator.config.kinds import CHILDREN
from rlt_sandbox.sandbox import InProcessOperator

pytestmark = pytest.mark.timeout(120)

CMS = "/api/v1/namespaces/default/configmaps"


async def watch_lines(harness, **params: str) -> list[tuple[str, str]]:
    """Every event of one watch request, read until the server ends the stream."""
    async with harness.session.get(harness.url + CMS, params={"watch": "true", **params}) as resp:
        assert resp.status == 200
        body = (await resp.read()).decode()
    events = [json.loads(line) for line in body.splitlines() if line.strip()]
    # (type, name) of each event; an ERROR event's Status has no name: its message instead
    return [(e["type"], e["object"].get("metadata", {}).get("name") or e["object"].get("message")) for e in events]


async def test_a_watch_at_its_time_limit_ends_cleanly_and_a_rewatch_continues(harness):
    first = await harness.call("POST", CMS, {"metadata": {"name": "a"}})
    events = await watch_lines(harness, timeoutSeconds="1")  # held past its limit: nothing changes meanwhile
    assert events == [("ADDED", "a")]
    # The client re-watches from the version it has seen, as Kopf and client-go do: it gets what came since.
    await harness.call("POST", CMS, {"metadata": {"name": "b"}})
    since = first["metadata"]["resourceVersion"]
    events = await watch_lines(harness, timeoutSeconds="1", resourceVersion=since)
    assert events == [("ADDED", "b")]


async def test_the_operator_outlives_its_watches_time_limits(harness):
    """Kopf's watches end at a 1 s limit (the sandbox's is 300 s) again and again; the operator stays alive and
    still reconciles a run created after them."""
    before = harness.count_watches()
    harness.operator = InProcessOperator(overrides={"watch_server_timeout": 1.0})
    await harness.operator.start()
    # Every watch of the operator's has been opened three times: each ended at its limit at least twice.
    await harness.wait(
        lambda: harness.count_watches() - before >= 3 * (len(CHILDREN) + 1), "watches re-opened", timeout=60
    )
    assert harness.operator.alive, harness.operator.error
    await harness.create_run(example())
    await harness.wait_object("jobs", "tiny-sft")
    assert harness.operator.alive, harness.operator.error


async def test_an_object_created_just_after_a_watchs_snapshot_is_streamed(harness):
    """A watch sends the objects as they are, then every change. kmock joined the change stream only after
    sending the snapshot, so an object created in between was lost to that watch: the sandbox's restarted
    operator never saw the run applied as it started watching. Reading the stream by hand puts the create
    exactly in that gap."""
    await harness.call("POST", CMS, {"metadata": {"name": "a"}})
    await watch_lines(harness, timeoutSeconds="1")  # a real watch request, to take its parsed form
    request = next(r for r in reversed(harness.cluster._requests) if r.params.get("watch") == "true")
    response = await harness.cluster._serve_watch(request)
    stream = aiter(response.payload)
    got: list[tuple[str, str]] = []
    try:
        assert await anext(stream) == b""  # the headers
        event = await anext(stream)
        got.append((event["type"], event["object"]["metadata"]["name"]))
        assert got == [("ADDED", "a")]  # the snapshot, sent; the stream has not been read further

        await harness.call("POST", CMS, {"metadata": {"name": "b"}})
        event = await asyncio.wait_for(anext(stream), timeout=5)
        got.append((event["type"], event["object"]["metadata"]["name"]))
    except (StopAsyncIteration, TimeoutError):
        pass
    finally:
        await stream.aclose()
    assert got == [("ADDED", "a"), ("ADDED", "b")]
