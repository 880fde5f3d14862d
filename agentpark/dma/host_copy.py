"""host_copy: the CPU backend, where the pool already lives in host memory.

Pause: ``np.asarray(pool)`` is a zero-copy view on JAX's CPU backend, so parking is one
gather-copy per run of tier slots straight into the preallocated tier buffer
(``np.take`` with ``mode="clip"``: the default ``"raise"`` stages ``out`` through a
temporary and runs at a quarter of memcpy speed; ids are bounds-checked once instead).

Restore: jitted writes with the pool donated (in place), whose input is a view of the tier
buffer itself (zero-copy: JAX aliases 64-byte-aligned host memory, and every tier's
buffers are page aligned). Runs consecutive in the pool too are written with
``dynamic_update_slice`` in power-of-two pieces (a memcpy, ~0.95x); scattered blocks go
through a scatter whose update is a power-of-two window of the tier buffer, rows not being
restored getting an out-of-range id and dropped (~0.85x). Few shapes are ever compiled.
Gathering inside the jit instead runs at a tenth of memcpy speed on XLA:CPU.

Copies go in chunks of at most ``chunk_bytes``, each under the engine lock and the lock
let go between chunks, so other sessions keep decoding while a large session moves: the
bytes in flight at any moment are bounded by one chunk.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial

import jax
import numpy as np

from agentpark.blocks import check_copy, contiguous_runs
from agentpark.engine.base import EngineAdapter
from agentpark.errors import TransferError
from agentpark.tiers.base import HostTier

__all__ = ["DEFAULT_CHUNK_BYTES", "HostCopyTransfer"]

log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 64 * 2**20


@partial(jax.jit, donate_argnums=0)
def _scatter_rows(pool: jax.Array, window: jax.Array, targets: jax.Array) -> jax.Array:
    return pool.at[targets].set(window, mode="drop")


@partial(jax.jit, donate_argnums=0)
def _write_rows(pool: jax.Array, rows: jax.Array, first: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_slice_in_dim(pool, rows, first, axis=0)


# A run at least this long that is consecutive in the pool too is written with a
# dynamic_update_slice (a plain memcpy in XLA, ~0.95x memcpy) instead of the scatter
# (~0.85x); shorter, scattered runs keep the scatter, which takes any block order.
_SLICE_MIN_BLOCKS = 8


def _bucket(n: int, cap: int) -> int:
    return min(1 << (n - 1).bit_length(), cap)


class HostCopyTransfer:
    """Moves blocks with memcpy-class host copies; the default on the CPU platform."""

    name = "host_copy"

    def __init__(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self.chunk_bytes = chunk_bytes
        # Called between chunks, outside the engine lock: progress bars, and tests that
        # need a copy held open while they check that others are not blocked.
        self.chunk_hook: Callable[[int], None] | None = None
        self._warned_unaligned = False

    def _pieces(
        self, engine: EngineAdapter, block_ids: Sequence[int], slots: Sequence[int]
    ) -> list[tuple[Sequence[int], Sequence[int]]]:
        per = max(1, self.chunk_bytes // engine.geometry.block_nbytes)
        return [(block_ids[i : i + per], slots[i : i + per]) for i in range(0, len(slots), per)]

    def _after_chunk(self, nbytes: int) -> None:
        if self.chunk_hook is not None:
            self.chunk_hook(nbytes)

    def d2h(
        self, engine: EngineAdapter, block_ids: Sequence[int], tier: HostTier, slots: Sequence[int]
    ) -> None:
        check_copy(block_ids, engine.geometry.num_blocks, slots, tier.capacity_blocks)
        for ids, piece_slots in self._pieces(engine, block_ids, slots):
            src_ids = np.asarray(ids, dtype=np.intp)
            with engine.lock:
                for arr, buf in zip(engine.kv_pool(), tier.buffers(), strict=True):
                    view = np.asarray(arr)  # zero-copy on the CPU platform
                    for pos, slot, n in contiguous_runs(piece_slots):
                        out = buf[slot : slot + n]
                        np.take(view, src_ids[pos : pos + n], axis=0, out=out, mode="clip")
                    # A live view would make the next donating step copy the whole pool.
                    del view
            self._after_chunk(len(ids) * engine.geometry.block_nbytes)

    def h2d(
        self, tier: HostTier, slots: Sequence[int], engine: EngineAdapter, block_ids: Sequence[int]
    ) -> None:
        check_copy(block_ids, engine.geometry.num_blocks, slots, tier.capacity_blocks)
        for ids, piece_slots in self._pieces(engine, block_ids, slots):
            with engine.lock:
                pool = list(engine.kv_pool())
                try:
                    for pos, slot, n in contiguous_runs(piece_slots):
                        run_ids = ids[pos : pos + n]
                        for i, buf in enumerate(tier.buffers()):
                            pool[i] = self._restore_run(pool[i], buf, slot, run_ids, engine)
                    jax.block_until_ready(pool)  # type: ignore[no-untyped-call]
                except Exception as exc:
                    raise TransferError(f"restore scatter failed: {exc}") from exc
                finally:
                    engine.set_kv_pool(pool)
            self._after_chunk(len(ids) * engine.geometry.block_nbytes)

    def _restore_run(
        self,
        pool: jax.Array,
        buf: np.ndarray,
        slot: int,
        ids: Sequence[int],
        engine: EngineAdapter,
    ) -> jax.Array:
        """Write tier rows ``slot..slot+len(ids)`` into pool blocks ``ids``."""
        runs = contiguous_runs(ids)
        if all(n >= _SLICE_MIN_BLOCKS for _pos, _first, n in runs):
            for pos, first, n in runs:
                # Power-of-two pieces: a fixed, small set of shapes is ever compiled.
                for offset, size in _power_of_two_pieces(n):
                    rows = buf[slot + pos + offset : slot + pos + offset + size]
                    self._warn_if_unaligned(rows)
                    pool = _write_rows(pool, rows, np.int32(first + offset))
            return pool
        size = _bucket(len(ids), buf.shape[0])
        start = min(slot, buf.shape[0] - size)
        targets = np.full(size, engine.geometry.num_blocks, dtype=np.int32)
        targets[slot - start : slot - start + len(ids)] = ids
        window = buf[start : start + size]
        self._warn_if_unaligned(window)
        scattered: jax.Array = _scatter_rows(pool, window, targets)
        return scattered

    def warmup(self, engine: EngineAdapter, tier: HostTier) -> None:
        """Compile both restore paths for every shape a restore can use, writing nothing.

        The scatter gets all targets out of range; the slice write puts the pool's own
        first rows back in place. Without this, the first restore of each new size pays
        its compile (tens of ms) in the resume it delays.
        """
        per = max(1, self.chunk_bytes // engine.geometry.block_nbytes)
        if tier.capacity_blocks == 0:
            return
        sizes = sorted({_bucket(n, tier.capacity_blocks) for n in _powers_of_two(per)})
        with engine.lock:
            pool = list(engine.kv_pool())
            try:
                for size in sizes:
                    targets = np.full(size, engine.geometry.num_blocks, dtype=np.int32)
                    for i, buf in enumerate(tier.buffers()):
                        pool[i] = _scatter_rows(pool[i], buf[:size], targets)
                        if size <= engine.geometry.num_blocks:
                            same = np.array(np.asarray(pool[i][:size]))  # its own rows
                            pool[i] = _write_rows(pool[i], same, np.int32(0))
                jax.block_until_ready(pool)  # type: ignore[no-untyped-call]
            finally:
                engine.set_kv_pool(pool)

    def _warn_if_unaligned(self, window: np.ndarray) -> None:
        if window.ctypes.data % 64 and not self._warned_unaligned:
            self._warned_unaligned = True
            log.warning(
                "host_copy: a tier buffer is not 64-byte aligned; every restore copies it "
                "first and runs at a fraction of memcpy speed"
            )


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
