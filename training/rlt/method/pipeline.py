"""Work on results while the next ones are being made: `fn` runs on up to `in_flight` threads ahead of the caller,
and the results come back in the order of the items, whatever order they finish in (the same rows in the same order
as one at a time). Used by distillation: HTTP requests to the vLLM generators in flight while the rank scores the
answers that came back."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def in_order(fn: Callable[[T, threading.Event], R], items: Iterable[T], in_flight: int) -> Iterator[tuple[T, R]]:
    """(item, fn(item, cancel)) for each item, in order, with up to `in_flight` calls running at once while the caller
    works. When the caller stops early (an error, a break), `cancel` is set for the calls still running, which
    should return soon after (rlt.method.generation.server_generate closes its stream), and none is started."""
    cancel = threading.Event()
    pool = ThreadPoolExecutor(max_workers=max(1, in_flight), thread_name_prefix="in-flight")
    running: deque[tuple[T, Future[R]]] = deque()
    pending = iter(items)
    try:
        for item in pending:
            running.append((item, pool.submit(fn, item, cancel)))
            if len(running) >= in_flight:
                break
        while running:
            item, future = running.popleft()
            result = future.result()
            for nxt in pending:  # refill before the caller works on this result: the server stays busy
                running.append((nxt, pool.submit(fn, nxt, cancel)))
                break
            yield item, result
    finally:
        cancel.set()
        pool.shutdown(wait=True, cancel_futures=True)
