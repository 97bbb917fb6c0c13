"""rlt.method.pipeline.as_completed: the slots stay full whatever the caller and the slowest call do, results come
back as they finish, and a caller that stops early (a scoring error in distill) cancels the calls still running and
starts none, so the rank exits at once instead of waiting out long generations."""

from __future__ import annotations

import threading
import time

import pytest

from rlt.method.pipeline import as_completed


def test_every_slot_stays_busy_while_the_caller_works_and_the_longest_call_runs():
    """Item 0 runs 20× longer than the others and the caller works on every result for longer than a call: with 4
    in flight, never more than 4 calls run, and until the last item has started 4 run at (nearly) every instant
    (sampled every 2 ms: a refill takes a thread switch); the results come back in the order the calls end."""
    lock = threading.Lock()
    running = {"now": 0, "started": 0}
    samples: list[int] = []

    def call(item: int, cancel: threading.Event) -> int:
        with lock:
            running["now"] += 1
            running["started"] += 1
        time.sleep(0.4 if item == 0 else 0.02)
        with lock:
            running["now"] -= 1
        return item * 10

    def sample() -> None:
        while running["started"] < 24:
            samples.append(running["now"])
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    got = []
    for item, result in as_completed(call, range(24), 4):
        assert result == item * 10
        time.sleep(0.03)  # the caller's work (scoring)
        got.append(item)
    sampler.join()
    assert sorted(got) == list(range(24)) and got.index(0) > 3, f"handed over out of the order calls ended: {got}"
    assert max(samples) == 4, f"more than 4 calls at once: {max(samples)}"
    mean = sum(samples) / len(samples)
    assert mean >= 0.9 * 4, f"mean calls running {mean:.2f} of 4 while items were left"


def test_a_caller_that_stops_early_cancels_the_calls_in_flight_and_starts_no_more():
    started: list[int] = []
    lock = threading.Lock()

    def long_request(item: int, cancel: threading.Event) -> int:
        with lock:
            started.append(item)
        if item > 0:
            cancel.wait(timeout=60)  # a long generation, cut short by cancel (server_generate closes its stream)
            assert cancel.is_set(), "waited out the whole generation"
        return item

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="scoring failed"):
        for _item, _result in as_completed(long_request, range(100), 4):
            raise RuntimeError("scoring failed")
    # the requests in flight would hold it 60 s; the margin is for a loaded machine
    assert time.monotonic() - t0 < 30, "the caller's error waited for the requests in flight"
    # 4 in flight, then the refill after the first answer (it may be cancelled before it starts), then none
    assert {0, 1, 2, 3} <= set(started) <= {0, 1, 2, 3, 4}, sorted(started)


def test_an_error_of_a_call_reaches_the_caller():
    def call(item: int, cancel: threading.Event) -> int:
        if item == 2:
            raise ValueError("bad answer")
        return item

    with pytest.raises(ValueError, match="bad answer"):
        list(as_completed(call, range(5), 2))
