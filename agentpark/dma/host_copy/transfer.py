"""HostCopyTransfer: the host_copy backend's face, what the DMA core's callers hold.

It keeps the settings (``dma.copy_threads``, ``dma.hash_thread``, ``dma.native_copy``,
``in_place`` and the chunk size: plain attributes, read once at the start of each copy),
the threads (copy workers, the hash thread) and the observer, and hands each copy to
pause.py or restore.py with a :class:`~agentpark.dma.host_copy.run.CopyRun`. Which loop a
chunk runs is the selector's; how it copies is each strategy module's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from agentpark.blocks import check_copy
from agentpark.dma import native
from agentpark.dma.host_copy.hash_thread import PieceHasher
from agentpark.dma.host_copy.observer import CopyObserver, NullObserver
from agentpark.dma.host_copy.pause import pause
from agentpark.dma.host_copy.restore import Restorer
from agentpark.dma.host_copy.run import CopyRun, run_hashed
from agentpark.dma.host_copy.selector import loop_name
from agentpark.dma.host_copy.settings import (
    DEFAULT_CHUNK_BYTES,
    HASH_DEPTH,
    HASH_SPAN_BYTES,
    MAX_COPY_THREADS,
    CopySettings,
)
from agentpark.dma.host_copy.workers import CopyWorkers
from agentpark.engine.base import EngineAdapter
from agentpark.tiers.base import HostTier

__all__ = ["HostCopyTransfer"]


class HostCopyTransfer:
    """Moves blocks with memcpy-class host copies; the default on the CPU platform.

    ``observer`` (default: none) hears each chunk done and each restore chunk's path
    (agentpark.dma.host_copy.observer); it may be replaced between copies.
    """

    name = "host_copy"

    def __init__(
        self,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        copy_threads: int = 1,
        hash_thread: bool = False,
        in_place: bool = True,
        native_copy: bool = True,
        observer: CopyObserver | None = None,
    ) -> None:
        if not 1 <= copy_threads <= MAX_COPY_THREADS:
            raise ValueError(f"copy_threads must be 1..{MAX_COPY_THREADS}, got {copy_threads}")
        self.chunk_bytes = chunk_bytes
        self.copy_threads = copy_threads
        # dma.hash_thread: with a checksum, one more thread hashes while the copy runs;
        # copies of one span or less stay fused.
        self.hash_thread = hash_thread
        self.hash_span_bytes = HASH_SPAN_BYTES
        # Restores write the pool's own memory with numpy where it allows (in_place).
        self.in_place = in_place
        # dma.native_copy: the native kernel where it is built and takes the arrays.
        self.native_copy = native_copy and native.available() is not None
        self.observer: CopyObserver = observer if observer is not None else NullObserver()
        self.hasher = PieceHasher(HASH_DEPTH)
        self._workers = CopyWorkers()
        self._restorer = Restorer()

    @property
    def settings(self) -> CopySettings:
        """The settings as they are now: what the next copy runs with."""
        return CopySettings(
            chunk_bytes=self.chunk_bytes,
            copy_threads=self.copy_threads,
            hash_thread=self.hash_thread,
            hash_span_bytes=self.hash_span_bytes,
            in_place=self.in_place,
            native_copy=self.native_copy,
        )

    @property
    def copy_loop(self) -> str:
        """Which copy loop pauses and in-place restores run (for the start-up log)."""
        return loop_name(self.settings)

    def d2h(
        self,
        engine: EngineAdapter,
        block_ids: Sequence[int],
        tier: HostTier,
        slots: Sequence[int],
        digest: bool = False,
    ) -> str | None:
        """Copy pool blocks into tier slots; with ``digest``, hash each piece as it goes.

        Each piece (integrity.piece_blocks) is hashed from the pool as it is copied; the
        pieces of a chunk are split over ``copy_threads`` threads in whole pieces, so the
        checksum is the same for any thread count.
        """
        check_copy(block_ids, engine.geometry.num_blocks, slots, tier.capacity_blocks)
        buffers = tier.buffers()

        def body(run: CopyRun) -> list[bytes]:
            return pause(run, engine, block_ids, buffers, slots)

        return self._run(engine, buffers, slots, digest, body)

    def h2d(
        self,
        tier: HostTier,
        slots: Sequence[int],
        engine: EngineAdapter,
        block_ids: Sequence[int],
        digest: bool = False,
    ) -> str | None:
        """Copy tier slots into pool blocks; with ``digest``, hash each piece as it goes.

        In place where the pool allows it, through XLA otherwise (agentpark.dma.host_copy.
        restore). The caller compares the returned checksum and must not use the blocks
        when it differs (they hold whatever the tier held).
        """
        check_copy(block_ids, engine.geometry.num_blocks, slots, tier.capacity_blocks)
        buffers = tier.buffers()

        def body(run: CopyRun) -> list[bytes]:
            return self._restorer.restore(run, engine, buffers, slots, block_ids)

        return self._run(engine, buffers, slots, digest, body)

    def warmup(self, engine: EngineAdapter, tier: HostTier) -> None:
        """Compile both XLA restore paths for every shape a restore can use, and the
        in-place path's no-op, writing nothing."""
        settings = self.settings
        chunk_blocks = settings.chunk_blocks(engine.geometry)
        self._restorer.warmup(engine, tier, chunk_blocks, settings.in_place)

    def close(self) -> None:
        """Stop the worker and hash threads (a later copy starts them again)."""
        self._workers.close()
        self.hasher.close()

    def _run(
        self,
        engine: EngineAdapter,
        buffers: list[np.ndarray],
        slots: Sequence[int],
        digest: bool,
        body: Callable[[CopyRun], list[bytes]],
    ) -> str | None:
        """``body`` with this copy's settings, threads and observer; the checksum, if any."""
        return run_hashed(
            self.settings,
            self.hasher,
            self._workers,
            self.observer,
            engine.geometry,
            buffers,
            slots,
            digest,
            body,
        )
