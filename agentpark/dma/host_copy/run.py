"""One copy's context (:class:`CopyRun`), and the checksum taken fused or on the hash thread.

A pause or a restore is a loop over chunks (pause.py, restore.py); everything that loop
needs but does not decide travels in a :class:`CopyRun`: the settings as they were at the
copy's start, the copy threads, the observer, whether it hashes and the hash thread's job.
:func:`run_hashed` starts the job (or not), runs the loop and combines the digests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from agentpark.blocks import PoolGeometry
from agentpark.dma.host_copy.hash_thread import HashJob, PieceHasher
from agentpark.dma.host_copy.observer import CopyObserver
from agentpark.dma.host_copy.selector import hash_job, pick_loop
from agentpark.dma.host_copy.settings import CopySettings, parts
from agentpark.dma.host_copy.strategy import CopyLoop, PartCopy
from agentpark.dma.host_copy.workers import CopyWorkers
from agentpark.integrity import combine

__all__ = ["CopyRun", "run_hashed"]


@dataclass(frozen=True)
class CopyRun:
    """What one d2h or h2d call runs with."""

    settings: CopySettings
    geometry: PoolGeometry
    workers: CopyWorkers
    observer: CopyObserver
    digest: bool
    job: HashJob | None
    """The hash thread's job; None: hashed fused on the copying threads (or not at all)."""

    def chunks(self, n: int) -> list[tuple[int, int]]:
        """``[lo, hi)`` positions of each chunk of an ``n``-block copy."""
        return self.settings.chunks(self.geometry, n)

    def loop(self, dsts: Sequence[np.ndarray], srcs: Sequence[np.ndarray]) -> CopyLoop:
        """The copy loop for a chunk from ``srcs`` into ``dsts`` (agentpark.dma.host_copy.
        selector)."""
        return pick_loop(self.settings, self.geometry, self.digest, self.job, dsts, srcs)

    def copy(self, part: PartCopy, n: int, unit: int) -> list[bytes]:
        """Positions ``0..n`` of a chunk, split over the copy threads in whole ``unit``s;
        the piece digests in order."""
        threads = self.settings.copy_threads
        done = self.workers.map(part, parts(0, n, unit, threads), threads)
        return [digest for piece in done for digest in piece]

    def chunk_done(self, blocks: int) -> None:
        """Tell the observer; called between chunks, outside the engine lock."""
        self.observer.on_chunk(blocks * self.geometry.block_nbytes)


def run_hashed(
    settings: CopySettings,
    hasher: PieceHasher,
    workers: CopyWorkers,
    observer: CopyObserver,
    geometry: PoolGeometry,
    buffers: Sequence[np.ndarray],
    slots: Sequence[int],
    digest: bool,
    body: Callable[[CopyRun], list[bytes]],
) -> str | None:
    """Run ``body`` with the hash thread's job or fused; the checksum, if ``digest``."""
    job = hash_job(settings, hasher, geometry, buffers, slots) if digest else None
    run = CopyRun(settings, geometry, workers, observer, digest, job)
    if job is None:
        pieces = body(run)
        return combine(pieces) if digest else None
    try:
        body(run)
        return combine(job.finish())
    finally:
        job.abandon()  # a no-op after finish; after a failure, waits for the thread
