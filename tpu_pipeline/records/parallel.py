"""An ordered, bounded parallel map over a thread pool.

Threads, not processes: the expensive work (image decoding, file reads, TensorFlow encoders) runs in
C++ kernels that release the GIL, and threads need neither pickling nor a TensorFlow start per
worker. Order is kept so the output (and a resumed run) is the same whatever the thread timing.
"""
from __future__ import annotations

import collections
import concurrent.futures
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(
    fn: Callable[[T], R], items: Iterable[T], executor: concurrent.futures.Executor, window: int
) -> Iterator[R]:
    """Yields fn(item) in input order, keeping at most `window` items in flight (bounded memory)."""
    pending: collections.deque[concurrent.futures.Future] = collections.deque()
    try:
        for item in items:
            pending.append(executor.submit(fn, item))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:  # stopped early (an error, or the consumer closed us)
            future.cancel()
