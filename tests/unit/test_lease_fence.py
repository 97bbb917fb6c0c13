"""The fence checker the HA tests judge server logs with (tests/lease_fence.py): it must flag a write outside its
sender's leadership window, and one that raced another replica's claim, and pass writes inside a window."""

from __future__ import annotations

from lease_fence import Write, kopf_bookkeeping, lease_claims, turns, unfenced_writes, windows

LEASE = "sys/rlt"


def claim(start: float, end: float, who: str, holder: str | None = None, ok: bool = True) -> Write:
    body = {"spec": {"holderIdentity": who if holder is None else holder}}
    return Write(start, end, who, "update", "leases", LEASE, body, ok)


def act(start: float, end: float, who: str, resource: str = "rltruns/status", body: object = None) -> Write:
    return Write(start, end, who, "patch", resource, "ns/tiny", body)


def test_writes_inside_their_senders_windows_pass():
    log = [claim(0, 1, "a"), act(2, 3, "a"), claim(4, 5, "a"), claim(20, 21, "b"), act(22, 23, "b")]
    assert unfenced_writes(log, LEASE) == []
    assert turns(lease_claims(log, LEASE)) == ["a", "b"]
    assert windows(lease_claims(log, LEASE), 30) == [("a", 1, 20), ("b", 21, 30)]


def test_a_write_after_anothers_claim_is_flagged():
    late = act(22, 23, "a")
    bad = unfenced_writes([claim(0, 1, "a"), claim(20, 21, "b"), late], LEASE)
    assert bad == [(late, "b")]


def test_a_write_still_in_flight_when_another_claim_arrives_is_flagged():
    """Sent inside a's window, answered after b's claim was received: it may have been applied after b took over."""
    racing = act(19.5, 20.5, "a")
    bad = unfenced_writes([claim(0, 1, "a"), claim(20, 21, "b"), racing], LEASE)
    assert [w for w, _ in bad] == [racing]


def test_a_write_before_any_claim_or_after_a_release_is_flagged():
    early, after = act(0.5, 0.6, "a"), act(6, 7, "a")
    log = [early, claim(1, 2, "a"), claim(5, 5.5, "a", holder=""), after]
    assert [w for w, _ in unfenced_writes(log, LEASE)] == [early, after]


def test_refused_claims_other_leases_and_the_election_itself_do_not_count():
    log = [
        claim(0, 1, "a"),
        claim(3, 4, "b", ok=False),  # a 409: b did not take it
        Write(5, 6, "b", "update", "leases", "sys/other", {"spec": {"holderIdentity": "b"}}),
        act(7, 8, "a"),
        act(9, 10, "b", "kopfpeerings"),  # the standby's keep-alive
        act(11, 12, "b", "rltruns", {"metadata": {"finalizers": ["rlt.dev/finalizer"]}}),  # Kopf's own
    ]
    assert unfenced_writes(log, LEASE) == []
    # a run patch that is more than Kopf's bookkeeping is covered
    spec = act(13, 14, "b", "rltruns", {"metadata": {"finalizers": []}, "spec": {"suspend": True}})
    assert [w for w, _ in unfenced_writes([*log, spec], LEASE)] == [spec]
    assert not kopf_bookkeeping("not a patch")
