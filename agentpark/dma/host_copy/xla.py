"""The restore through XLA's donated writes: when the pool cannot be written in place.

Jitted writes with the pool donated (in place), whose input is a view of the tier buffer
itself (zero-copy: JAX aliases 64-byte-aligned host memory, and every tier's buffers are
page aligned). Runs consecutive in the pool too are written with ``dynamic_update_slice``
in power-of-two pieces (a memcpy); scattered blocks go through a scatter whose update is a
power-of-two window of the tier buffer, rows not being restored getting an out-of-range id
and dropped. Few shapes are ever compiled (:meth:`XlaWriter.warmup`). Gathering inside the
jit instead runs at a tenth of memcpy speed on XLA:CPU. It is one XLA copy on one thread:
more ``copy_threads`` can only hash beside it.

With the checksum, the tier is hashed a span at a time, then the span is written into the
pool while it is still in the (32 MiB) L3; with ``copy_threads`` > 1 the workers hash the
span while this thread writes it; with the hash thread, that thread does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, wait
from functools import partial

import jax
import numpy as np

from agentpark.blocks import contiguous_runs, paired_runs
from agentpark.dma.host_copy.numpy_loop import hash_rows
from agentpark.dma.host_copy.run import CopyRun
from agentpark.dma.host_copy.settings import parts
from agentpark.engine.base import EngineAdapter
from agentpark.errors import TransferError
from agentpark.integrity import piece_blocks
from agentpark.tiers.base import HostTier

__all__ = ["XlaWriter", "scatter_write", "slice_write"]

log = logging.getLogger(__name__)

# A restore with its checksum hashes this much of the tier, then writes it into the pool
# while it is still in the L3; a piece at a time would pay a jit dispatch per MiB.
_FUSED_SPAN_BYTES = 8 * 2**20
# A run at least this long that is consecutive in the pool too is written with a
# dynamic_update_slice (a plain memcpy in XLA, ~0.95x memcpy) instead of the scatter
# (~0.85x); shorter, scattered runs keep the scatter, which takes any block order.
_SLICE_MIN_BLOCKS = 8


@partial(jax.jit, donate_argnums=0)
def scatter_write(pool: jax.Array, window: jax.Array, targets: jax.Array) -> jax.Array:
    """Rows of ``window`` into pool blocks ``targets`` (out-of-range targets dropped)."""
    return pool.at[targets].set(window, mode="drop")


@partial(jax.jit, donate_argnums=0)
def slice_write(pool: jax.Array, rows: jax.Array, first: jax.Array) -> jax.Array:
    """``rows`` into pool blocks ``first..first+len(rows)``."""
    return jax.lax.dynamic_update_slice_in_dim(pool, rows, first, axis=0)


class XlaWriter:
    """Writes restore chunks through XLA; warns once about a tier buffer it must copy."""

    def __init__(self) -> None:
        self._warned_unaligned = False

    def restore_chunk(
        self,
        run: CopyRun,
        engine: EngineAdapter,
        buffers: Sequence[np.ndarray],
        chunk_slots: Sequence[int],
        ids: Sequence[int],
        offset: int,
    ) -> list[bytes]:
        """One chunk (hold the engine lock); the piece digests hashed here, in order."""
        geometry = engine.geometry
        k = piece_blocks(geometry)
        if run.job is not None:
            span = run.settings.span_blocks(geometry)
        else:
            span = max(k, _FUSED_SPAN_BYTES // geometry.block_nbytes // k * k)
        threads = run.settings.copy_threads
        pieces: list[bytes] = []
        # Slice writes when every run consecutive on both sides is long (a memcpy); else
        # the scatter, which takes any block order.
        slices = all(n >= _SLICE_MIN_BLOCKS for n in paired_runs(chunk_slots, ids)[2])
        n = len(ids)
        spans = [(a, min(a + span, n)) for a in range(0, n, span)] if run.digest else [(0, n)]
        pool = list(engine.kv_pool())
        try:
            for a, b in spans:
                pending: list[Future[list[bytes]]] = []
                if run.job is not None:
                    # The hash thread reads the span beside this thread's write.
                    run.job.post(offset + a, offset + b)
                elif run.digest and threads > 1:
                    # Overlap: the workers hash the span while this thread writes it.
                    hash_span = partial(hash_rows, buffers, chunk_slots, k)
                    for x, y in parts(a, b, k, threads - 1):
                        pending.append(run.workers.submit(threads, hash_span, x, y))
                elif run.digest:
                    pieces.extend(hash_rows(buffers, chunk_slots, k, a, b))
                try:
                    for i, buf in enumerate(buffers):
                        pool[i] = self._write_span(
                            pool[i], buf, chunk_slots[a:b], ids[a:b], slices, engine
                        )
                finally:
                    wait(pending)
                for future in pending:
                    pieces.extend(future.result())
            jax.block_until_ready(pool)  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise TransferError(f"restore scatter failed: {exc}") from exc
        finally:
            engine.set_kv_pool(pool)
        return pieces

    def warmup(self, engine: EngineAdapter, tier: HostTier, chunk_blocks: int) -> None:
        """Compile both writes for every shape a restore of chunks of ``chunk_blocks`` can
        use, writing nothing (hold the engine lock).

        The scatter gets all targets out of range; the slice write puts the pool's own
        first rows back in place.
        """
        sizes = sorted({_bucket(n, tier.capacity_blocks) for n in _powers_of_two(chunk_blocks)})
        pool = list(engine.kv_pool())
        try:
            for size in sizes:
                targets = np.full(size, engine.geometry.num_blocks, dtype=np.int32)
                for i, buf in enumerate(tier.buffers()):
                    pool[i] = scatter_write(pool[i], buf[:size], targets)
                    if size <= engine.geometry.num_blocks:
                        same = np.array(np.asarray(pool[i][:size]))  # its own rows
                        pool[i] = slice_write(pool[i], same, np.int32(0))
            jax.block_until_ready(pool)  # type: ignore[no-untyped-call]
        finally:
            engine.set_kv_pool(pool)

    def _write_span(
        self,
        pool: jax.Array,
        buf: np.ndarray,
        slots: Sequence[int],
        ids: Sequence[int],
        slices: bool,
        engine: EngineAdapter,
    ) -> jax.Array:
        """Write tier rows ``slots[i]`` into pool blocks ``ids[i]`` of one pool array."""
        if slices:
            for start, first, n in zip(*paired_runs(slots, ids), strict=True):
                # Power-of-two pieces: a fixed, small set of shapes is ever compiled.
                for offset, size in _power_of_two_pieces(n):
                    rows = buf[start + offset : start + offset + size]
                    self._warn_if_unaligned(rows)
                    pool = slice_write(pool, rows, np.int32(first + offset))
            return pool
        for pos, slot, n in contiguous_runs(slots):
            pool = self._scatter_run(pool, buf, slot, ids[pos : pos + n], engine)
        return pool

    def _scatter_run(
        self,
        pool: jax.Array,
        buf: np.ndarray,
        slot: int,
        ids: Sequence[int],
        engine: EngineAdapter,
    ) -> jax.Array:
        """Scatter tier rows ``slot..slot+len(ids)`` into pool blocks ``ids``."""
        size = _bucket(len(ids), buf.shape[0])
        start = min(slot, buf.shape[0] - size)
        targets = np.full(size, engine.geometry.num_blocks, dtype=np.int32)
        targets[slot - start : slot - start + len(ids)] = ids
        window = buf[start : start + size]
        self._warn_if_unaligned(window)
        scattered: jax.Array = scatter_write(pool, window, targets)
        return scattered

    def _warn_if_unaligned(self, window: np.ndarray) -> None:
        if window.ctypes.data % 64 and not self._warned_unaligned:
            self._warned_unaligned = True
            log.warning(
                "host_copy: a tier buffer is not 64-byte aligned; every restore copies it "
                "first and runs at a fraction of memcpy speed"
            )


def _bucket(n: int, cap: int) -> int:
    return min(1 << (n - 1).bit_length(), cap)


def _power_of_two_pieces(n: int) -> list[tuple[int, int]]:
    """Split ``n`` rows into (offset, size) pieces whose sizes are powers of two."""
    pieces, offset = [], 0
    for bit in range(n.bit_length() - 1, -1, -1):
        size = 1 << bit
        if n & size:
            pieces.append((offset, size))
            offset += size
    return pieces


def _powers_of_two(limit: int) -> list[int]:
    out, n = [], 1
    while n < limit:
        out.append(n)
        n *= 2
    return [*out, limit]
