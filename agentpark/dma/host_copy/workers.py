"""The copy threads of one transfer (``dma.copy_threads``): this thread and a small pool.

numpy's copies, the native kernel and xxhash all let go of the GIL, so the parts of a chunk
copied on several threads do run at once. The pool holds ``copy_threads - 1`` threads,
started on first use; :meth:`CopyWorkers.map` runs the last part on the calling thread and
never returns while a worker still writes, also when a part failed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

__all__ = ["CopyWorkers"]

_T = TypeVar("_T")


class CopyWorkers:
    """The worker threads beside the copying one; a later use after :meth:`close` restarts
    them."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def map(
        self, fn: Callable[[int, int], _T], ranges: Sequence[tuple[int, int]], threads: int
    ) -> list[_T]:
        """``fn`` over ``ranges``: the last on this thread, the others on the workers."""
        if len(ranges) == 1:
            return [fn(*ranges[0])]
        futures = [self.submit(threads, fn, a, b) for a, b in ranges[:-1]]
        try:
            last = fn(*ranges[-1])
        finally:
            # Never return (and let go of the engine lock, or free the slots) while a
            # worker still writes.
            wait(futures)
        return [*(f.result() for f in futures), last]

    def submit(self, threads: int, fn: Callable[[int, int], _T], lo: int, hi: int) -> Future[_T]:
        """``fn(lo, hi)`` on a worker; the pool is sized ``threads - 1`` when it starts."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    threads - 1, thread_name_prefix="agentpark-copy"
                )
            executor = self._executor
        return executor.submit(fn, lo, hi)

    def close(self) -> None:
        """Stop the workers, waiting for what they run."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
