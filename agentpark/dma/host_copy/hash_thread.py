"""The checksum on its own thread (``dma.hash_thread``): one core copies, another hashes.

Fused on the copying thread, the checksum costs its compute time: xxh3 runs at ~4x memcpy
speed from cache, so a one-thread copy+hash tops out near 0.8x memcpy. Here the copying
thread posts each span it has copied (pause) or is about to copy (restore) to a bounded
queue, and one hash thread hashes the span's pieces (agentpark.integrity) from the tier
buffer: on a pause right behind the copy, while the span is still in the shared L3; on a
restore beside the write, both reading the same span. The queue holds at most ``depth``
spans, so the copier never runs more than that far ahead of the hash (the span is still in
cache) and nothing is allocated per piece: the digests go into a list sized at the start.

The digests are the same bytes, in the same order, as the fused path's (``xxh3p:``): a
copy parked with one path verifies with the other. xxhash and numpy's copies release the
GIL on buffers of this size (measured: a Python loop keeps running beside them), so the two
threads do run at once when the machine has a core free for the second.

:class:`SpanLoop` is the copy loop of this strategy (agentpark.dma.host_copy.strategy):
numpy's copies, a span at a time, each span posted to the job. The selector uses it for a
checksummed copy of more than one span when ``dma.hash_thread`` is on and the thread is free.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

import numpy as np

from agentpark.blocks import contiguous_runs
from agentpark.dma.host_copy import numpy_loop
from agentpark.dma.host_copy.strategy import Chunk, PartCopy
from agentpark.integrity import piece_digest

__all__ = ["HashJob", "PieceHasher", "SpanLoop"]


class HashJob:
    """The pieces of one copy, hashed on the hash thread as spans are posted.

    ``slots``: the whole copy's tier slots; a posted span ``[lo, hi)`` is positions in it,
    ``lo`` on a piece boundary (a multiple of ``k``). Spans may come in any order and from
    several copy threads: each digest lands at its piece's index.
    """

    def __init__(
        self,
        executor: ThreadPoolExecutor,
        buffers: Sequence[np.ndarray],
        slots: Sequence[int],
        k: int,
        depth: int,
        release: Callable[[], None] = lambda: None,
    ) -> None:
        self._release = release
        self._buffers = list(buffers)
        self._slots = slots
        self._k = k
        self._queue: queue.Queue[tuple[int, int] | None] = queue.Queue(depth)
        pieces = -(-len(slots) // k)
        self._digests: list[bytes] = [b""] * (pieces * len(self._buffers))
        self._error: BaseException | None = None
        self._done = False
        self.hashed_here = 0  # spans the copier hashed itself: the hash thread was behind
        self._future: Future[None] = executor.submit(self._run)

    def post(self, lo: int, hi: int) -> None:
        """Have positions ``lo..hi`` of the copy hashed: by the hash thread when it has
        fewer than ``depth`` spans queued, else here, now (never waiting for it)."""
        try:
            self._queue.put_nowait((lo, hi))
        except queue.Full:
            self.hashed_here += 1
            self._hash(lo, hi)

    def finish(self) -> list[bytes]:
        """The piece digests in checksum order, once every span is hashed (what the hash
        thread has not started yet is hashed here, its current span waited for); then the
        thread is free for the next copy."""
        self._close(steal=True)
        if self._error is not None:
            raise self._error
        return self._digests

    def abandon(self) -> None:
        """After the copy failed: wait for the hash thread to let go of the buffers, then
        free it for the next copy. A no-op after :meth:`finish`."""
        self._close(steal=False)

    def _close(self, steal: bool) -> None:
        if self._done:
            return
        self._done = True
        while True:
            try:
                span = self._queue.get_nowait()
            except queue.Empty:
                break
            if steal and span is not None and self._error is None:
                self.hashed_here += 1
                self._hash(*span)
        self._queue.put(None)  # room: only this thread puts, and it just emptied the queue
        try:
            self._future.result()
        finally:
            self._release()

    def _hash(self, lo: int, hi: int) -> None:
        n = len(self._buffers)
        for p in range(lo, hi, self._k):
            runs = contiguous_runs(self._slots[p : min(p + self._k, hi)])
            at = p // self._k * n
            for j, buf in enumerate(self._buffers):
                self._digests[at + j] = piece_digest(buf, runs)

    def _run(self) -> None:
        while (span := self._queue.get()) is not None:
            if self._error is not None:
                continue  # keep draining up to the end marker
            try:
                self._hash(*span)
            except BaseException as exc:
                self._error = exc


class PieceHasher:
    """The one hash thread of a transfer, started on first use; one copy at a time.

    A second copy that finds it busy hashes fused on its own thread instead of waiting:
    waiting could deadlock (the first copy's next chunk needs the engine lock the second
    holds) and would serialise the two anyway.
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self._executor: ThreadPoolExecutor | None = None
        self._busy = threading.Lock()
        self._start_lock = threading.Lock()

    def try_start(
        self, buffers: Sequence[np.ndarray], slots: Sequence[int], k: int
    ) -> HashJob | None:
        """A job for one copy, or None when another copy is using the thread. The job's
        ``finish`` or ``abandon`` (call one, always) frees the thread again."""
        if not self._busy.acquire(blocking=False):
            return None
        try:
            return HashJob(self._pool(), buffers, slots, k, self.depth, self._busy.release)
        except BaseException:
            self._busy.release()
            raise

    def close(self) -> None:
        """Stop the thread (a later copy starts it again)."""
        with self._start_lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    @property
    def started(self) -> bool:
        return self._executor is not None

    def _pool(self) -> ThreadPoolExecutor:
        with self._start_lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="agentpark-hash")
            return self._executor


class SpanLoop:
    """numpy's copies a span (``span`` blocks, whole pieces) at a time, each span hashed
    by ``job``: on a pause posted once copied, on a restore just before it is written, so
    the two threads read it at once."""

    def __init__(self, job: HashJob, span: int) -> None:
        self.job = job
        self.unit = span

    def gather(self, chunk: Chunk) -> PartCopy:
        return partial(_gather_spans, chunk, self.unit, self.job)

    def scatter(self, chunk: Chunk) -> PartCopy:
        steps = np.diff(chunk.ids) == 1  # where the pool ids run on
        return partial(_scatter_spans, chunk, steps, self.unit, self.job)


def _gather_spans(chunk: Chunk, span: int, job: HashJob, lo: int, hi: int) -> list[bytes]:
    """Copy positions ``lo..hi`` of a chunk a span at a time, posting each copied span
    (positions in the whole copy: ``chunk.offset`` is the chunk's) to the hash thread."""
    for a in range(lo, hi, span):
        b = min(a + span, hi)
        numpy_loop.gather_rows(chunk.pool, chunk.tier, chunk.ids, chunk.slots, 0, a, b)
        job.post(chunk.offset + a, chunk.offset + b)
    return []


def _scatter_spans(
    chunk: Chunk, steps: np.ndarray, span: int, job: HashJob, lo: int, hi: int
) -> list[bytes]:
    """Copy positions ``lo..hi`` of a chunk a span at a time, posting each span to the
    hash thread just before writing it, so the two read it at once."""
    for a in range(lo, hi, span):
        b = min(a + span, hi)
        job.post(chunk.offset + a, chunk.offset + b)
        numpy_loop.scatter_rows(chunk.pool, chunk.tier, chunk.ids, steps, chunk.slots, 0, a, b)
    return []
