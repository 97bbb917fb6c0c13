"""Keep a fixed number of calls running and hand their results over as they finish: `fn` runs on `in_flight`
threads, a finished call is replaced by the next item at once (from the finished call's thread, not the caller's),
and the results come back in the order they finish. Used by distillation: one HTTP request per sequence to the
vLLM generators, as many in flight as the generators' KV caches were planned for, while the rank scores the
questions whose sequences came back (rows carry their index, so the order they are written in does not matter)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def as_completed(fn: Callable[[T, threading.Event], R], items: Iterable[T], in_flight: int) -> Iterator[tuple[T, R]]:
    """(item, fn(item, cancel)) for each item as it finishes, with `in_flight` calls running while items remain,
    whatever the caller is doing: a slot freed by a call is refilled before its result is handed over, so a slow
    caller (scoring) or a slow call (the longest sequence) leaves no slot empty. When the caller stops early (an
    error, a break), `cancel` is set for the calls still running, which should return soon after
    (rlt.method.generation.server_generate closes its stream), and none is started."""
    size = max(1, in_flight)
    cancel = threading.Event()
    pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="in-flight")
    finished: queue.SimpleQueue[tuple[T, Future[R]]] = queue.SimpleQueue()
    pending = iter(items)
    lock = threading.RLock()  # re-entered when a call ends before add_done_callback returns
    count = {"submitted": 0, "handed": 0}

    def submit_next() -> None:  # under `lock`
        if cancel.is_set():
            return
        for item in pending:
            future = pool.submit(fn, item, cancel)
            count["submitted"] += 1
            future.add_done_callback(partial(ended, item))
            return

    def ended(item: T, future: Future[R]) -> None:
        with lock:
            submit_next()  # the freed slot first: its result may wait on the caller
        finished.put((item, future))

    try:
        with lock:
            for _ in range(size):
                submit_next()
        while True:
            with lock:
                if count["handed"] == count["submitted"]:  # every refill happens before its call's result is put
                    return
            item, future = finished.get()
            count["handed"] += 1
            yield item, future.result()
    finally:
        with lock:
            cancel.set()
        pool.shutdown(wait=True, cancel_futures=True)
