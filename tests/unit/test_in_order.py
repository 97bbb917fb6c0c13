"""rlt.method.pipeline.in_order when its caller stops early (a scoring error in distill): the calls still running
are told to stop and none is started, so the rank exits at once instead of waiting out long generations."""

from __future__ import annotations

import threading
import time

import pytest

from rlt.method.pipeline import in_order


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
        for _item, _result in in_order(long_request, range(100), 4):
            raise RuntimeError("scoring failed")
    assert time.monotonic() - t0 < 5, "the caller's error waited for the requests in flight"
    # 4 in flight, then the refill after the first answer (it may be cancelled before it starts), then none
    assert {0, 1, 2, 3} <= set(started) <= {0, 1, 2, 3, 4}, sorted(started)
