"""The leader Lease (rlt_operator.cluster.leader) against the emulated API, on a controlled clock: who may act at each moment.

Two electors share one fake monotonic clock (the truth about time); their Lease reads and writes are real HTTP
requests to kmock. The property: at no clock reading do both `leads()`, and a holder that cannot renew stops acting
at its renew deadline, before another replica may take the lease.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import threading

import pytest

from rlt_operator.cluster.kube import Kube, NotLeader
from rlt_operator.cluster.leader import Elector, LeaseConfig, timing_problem
from rlt_operator.config.kinds import LEASE

NS = "default"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def electors(clock: Clock) -> tuple[Elector, Elector]:
    def one(identity: str) -> Elector:
        config = LeaseConfig(name="rlt-operator", namespace=NS, identity=identity)  # client-go's 15 / 10 / 2 s
        return Elector(config, Kube.from_environment(), clock=clock)

    return one("op-a"), one("op-b")


async def lease(harness) -> dict:
    return await harness.call("GET", f"{LEASE.collection_path(NS)}/rlt-operator")


async def test_a_leader_that_cannot_renew_stops_acting_before_another_may_take_over(harness):
    clock = Clock()
    a, b = electors(clock)
    assert await asyncio.to_thread(a.attempt, True)  # no Lease yet: op-a creates it and holds it
    assert not await asyncio.to_thread(b.attempt, True)  # held, just renewed
    start = clock.now
    # op-a renews twice, a retry period apart; op-b keeps trying and observes each renewal.
    for _ in range(2):
        clock.now += 2
        assert await asyncio.to_thread(a.attempt, True)
        assert not await asyncio.to_thread(b.attempt, True)
    renewed = clock.now
    # Now op-a cannot reach the API (a partition): each of its renewals fails; op-b still reaches it.
    a.kube.api.configuration.host = "http://127.0.0.1:9"
    timeline: list[tuple[float, bool, bool]] = []
    while clock.now < renewed + 20:
        clock.now += 0.5
        with pytest.raises(Exception, match="Connection refused|Max retries"):
            await asyncio.to_thread(a.attempt, True)
        await asyncio.to_thread(b.attempt, True)
        timeline.append((clock.now - renewed, a.leads(), b.leads()))
    assert not [t for t in timeline if t[1] and t[2]], "both acted at once"
    a_stopped = min(t for t, a_, _ in timeline if not a_)
    b_started = min((t for t, _, b_ in timeline if b_), default=None)
    assert a_stopped == 10.0, timeline  # its own renew deadline, counted from when its last renewal was sent
    assert a.leads() is False and start < renewed
    assert b_started == 15.0, (
        timeline
    )  # the lease, seen unchanged for its whole duration  # the lease, seen unchanged for its whole duration


async def test_the_standby_takes_over_once_the_record_has_not_changed_for_the_lease_duration(harness):
    clock = Clock()
    a, b = electors(clock)
    assert await asyncio.to_thread(a.attempt, True)
    assert not await asyncio.to_thread(b.attempt, True)
    took = None
    for step in range(1, 41):  # op-a frozen (SIGSTOP): it sends nothing; op-b tries every half second
        clock.now += 0.5
        if await asyncio.to_thread(b.attempt, True):
            took = step * 0.5
            break
        assert a.leads() == (step * 0.5 < 10), step  # op-a, frozen, would find its fence closed at 10 s
    assert took == 15.0
    spec = (await lease(harness))["spec"]
    assert spec["holderIdentity"] == "op-b" and spec["leaseTransitions"] == 1
    # op-a wakes up (SIGCONT): it neither acts nor takes the lease back while op-b renews.
    assert not a.leads()
    assert not await asyncio.to_thread(a.attempt, True)
    assert not a.leads() and a.holder == "op-b"


async def test_release_hands_over_at_the_standbys_next_try_and_a_fenced_write_is_never_sent(harness):
    clock = Clock()
    a, b = electors(clock)
    assert await asyncio.to_thread(a.attempt, True)
    gated = Kube.from_environment()
    gated.may_write = a.leads
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "written-by-a"}}
    assert await asyncio.to_thread(gated.create, "configmaps", NS, body) is None
    assert await asyncio.to_thread(a.release)
    sent = len(harness.cluster._requests)
    body["metadata"]["name"] = "after-release"
    with pytest.raises(NotLeader):
        await asyncio.to_thread(gated.create, "configmaps", NS, body)
    assert all("configmaps" not in r.url.path for r in list(harness.cluster._requests)[sent:]), "the write went out"
    assert not await asyncio.to_thread(a.attempt, True), "a replica that left does not take the lease back"
    clock.now += 2  # the next retry: no waiting out the 15 s
    assert await asyncio.to_thread(b.attempt, True)


@pytest.mark.parametrize("leaving", ["stopped", "paused"])
async def test_a_release_waits_for_the_fenced_write_on_the_wire_to_be_answered(harness, leaving):
    """A holder that leaves (stopped: SIGTERM's release; paused: Kopf's peering made it a non-candidate) while one of
    its writes has passed the fence but is not answered yet keeps the Lease named until the answer comes: cleared
    earlier, the standby could take it and write beside the late write (seen in the real-cluster suite: a run's
    status patch answered after its sender, paused by the peering, had released the Lease)."""
    clock = Clock()
    a, b = electors(clock)
    # The wait for the write is in real seconds (a retry period at most): long, so a slow machine cannot end it.
    a.config = dataclasses.replace(a.config, retry_period=8.0)
    gated = Kube.from_environment()
    gated.may_write = a.leads
    a.writes_settled = gated.writes_settled
    assert await asyncio.to_thread(a.attempt, True)
    on_the_wire, answer = threading.Event(), threading.Event()
    send = gated.api.call_api

    def held(*args, **kwargs):  # the request is sent once the test lets it: until then it is "on the wire"
        on_the_wire.set()
        answer.wait(10)
        return send(*args, **kwargs)

    gated.api.call_api = held
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late-write"}}
    write = asyncio.ensure_future(asyncio.to_thread(gated.create, "configmaps", NS, body))
    try:
        assert await asyncio.to_thread(on_the_wire.wait, 5)
        if leaving == "stopped":
            releasing = asyncio.ensure_future(asyncio.to_thread(a.release))
        else:  # what the election loop does when the peering pauses the holder
            a.step_down()
            releasing = asyncio.ensure_future(asyncio.to_thread(a.attempt, False))
        await asyncio.sleep(0.5)
        assert not a.leads() and not releasing.done()
        assert (await lease(harness))["spec"]["holderIdentity"] == "op-a", "released with a write on the wire"
    finally:
        answer.set()
    assert await write is None
    assert await releasing is (leaving == "stopped")
    assert (await lease(harness))["spec"]["holderIdentity"] == ""
    clock.now += 2
    assert await asyncio.to_thread(b.attempt, True)
    # A write that stays unanswered for a retry period: the Lease is left to expire rather than cleared under it.
    c = Elector(LeaseConfig(name="other", namespace=NS, identity="op-c"), Kube.from_environment(), clock=clock)
    c.writes_settled = lambda timeout: False
    assert await asyncio.to_thread(c.attempt, True)
    assert not await asyncio.to_thread(c.release)
    assert (await harness.call("GET", f"{LEASE.collection_path(NS)}/other"))["spec"]["holderIdentity"] == "op-c"


async def test_a_renewal_answered_while_the_holder_leaves_does_not_let_it_act_again(harness):
    """The election's renewal is on the wire when SIGTERM's release runs: the release reads the renewed record and
    clears it; the renewal's answer, arriving after, must not make the replica lead for another renew deadline."""
    clock = Clock()
    a, b = electors(clock)
    assert await asyncio.to_thread(a.attempt, True)
    applied, answered = threading.Event(), threading.Event()
    replace = a.kube.replace
    held = [True]

    def renewal_answered_late(*args):
        out = replace(*args)
        if held.pop() if held else False:  # only the renewal: the release's own clearing goes straight through
            applied.set()
            answered.wait(10)
        return out

    a.kube.replace = renewal_answered_late  # type: ignore[method-assign]
    clock.now += 2
    renewing = asyncio.ensure_future(asyncio.to_thread(a.attempt, True))
    try:
        assert await asyncio.to_thread(applied.wait, 5)
        assert await asyncio.to_thread(a.release)
    finally:
        answered.set()
    assert not await renewing and not a.leads(), "the late renewal made the leaving replica lead again"
    assert (await lease(harness))["spec"]["holderIdentity"] == ""
    clock.now += 2
    assert await asyncio.to_thread(b.attempt, True)


def test_leads_reads_its_renewal_once():
    """An attempt in its thread may clear the renewal while the fence reads it: the answer is one or the other, never
    an exception (which would end the election loop and fail the handlers' write with a TypeError)."""
    config = LeaseConfig(name="rlt-operator", namespace=NS, identity="op-a")
    elector: Elector

    def clock_read_while_an_attempt_steps_down() -> float:
        elector.step_down()
        return 1000.0

    elector = Elector(config, Kube(api=None), clock=clock_read_while_an_attempt_steps_down)
    elector.renewed_at = 999.0
    assert elector.leads() in (True, False)


async def test_of_two_candidates_that_read_the_same_record_one_wins(harness):
    """Both read the free Lease, both write: the write carries the resourceVersion read, so the second gets 409 (the
    emulated API checks it as the API server does) and that candidate does not lead."""
    clock = Clock()
    a, b = electors(clock)
    assert await asyncio.to_thread(a.attempt, True)
    assert await asyncio.to_thread(a.release)  # op-a leaves; it comes back as a new process
    a = Elector(a.config, Kube.from_environment(), clock=clock)
    clock.now += 2
    read = b.kube.get
    stale = await asyncio.to_thread(read, LEASE.plural, NS, "rlt-operator")
    b.kube.get = lambda *args: stale  # type: ignore[method-assign]  # b read before a wrote
    assert await asyncio.to_thread(a.attempt, True)
    assert not await asyncio.to_thread(b.attempt, True) and not b.leads()
    assert (await lease(harness))["spec"]["holderIdentity"] == "op-a"


async def test_of_two_candidates_that_both_saw_no_lease_one_creates_it_and_the_other_lists_nothing(harness):
    """The second create meets 409: that candidate does not lead, and reads no list (the Lease Role has get, create
    and update only: a list would be a 403 on a real cluster)."""
    clock = Clock()
    a, b = electors(clock)
    b.kube.get = lambda *args: None  # type: ignore[method-assign]  # b read before a created it

    def refused(*args, **kwargs):
        raise AssertionError("listed leases: the operator's Lease Role grants no list")

    b.kube.list = refused  # type: ignore[method-assign]
    assert await asyncio.to_thread(a.attempt, True)
    assert not await asyncio.to_thread(b.attempt, True) and not b.leads()
    assert (await lease(harness))["spec"]["holderIdentity"] == "op-a"


def test_timings_that_cannot_fence_are_refused():
    assert timing_problem(15, 10, 2) is None
    assert "must be below --lease-duration" in (timing_problem(10, 10, 2) or "")
    assert "below --renew-deadline" in (timing_problem(15, 10, 10) or "")


def test_rlt_operator_refuses_timings_that_cannot_fence_in_one_line():
    cmd = [sys.executable, "-c", "from rlt.cli import main; raise SystemExit(main())", "operator", "-A", "--peering"]
    proc = subprocess.run([*cmd, "x", "--renew-deadline", "15"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert (
        "--renew-deadline (15s) must be below --lease-duration (15s)" in proc.stderr and "Traceback" not in proc.stderr
    )
    proc = subprocess.run([*cmd, "x", "--retry-period", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--retry-period '0': expected seconds" in proc.stderr, proc.stderr
