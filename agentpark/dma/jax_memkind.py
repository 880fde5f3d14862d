"""jax_memkind: the accelerator backend, moving blocks between JAX memory kinds.

The pool lives in the ``device`` memory kind (HBM on a GPU or TPU). A pause gathers the
session's blocks on the device (one jitted take), moves them to the ``pinned_host`` memory
kind with ``jax.device_put(rows, sharding.with_memory_kind("pinned_host"))`` (a real DMA over
PCIe on an accelerator, no Python copies) and lands them in the tier's numpy rows. A restore
is the reverse: the tier rows go to the ``device`` memory kind with ``jax.device_put``, then a
jitted scatter writes them into the pool with the pool donated (in place). ``sharding`` is
always the pool array's own sharding, so a sharded pool stays sharded the same way; its block
axis must not be sharded (every device holds every block's slice, as TPU Sync also requires).

Why it is built this way:

* Lengths are bucketed to powers of two (gather ids padded with a real id, scatter targets
  padded with an out-of-range id that ``mode="drop"`` ignores), so a handful of shapes are
  ever compiled whatever the session length.
* Copies are cut into chunks of at most ``max_chunk_bytes`` per pool array, so the bytes in
  flight (gathered rows on the device and their pinned host copy) stay bounded.
* ``engine.lock`` is held only while the pool is read (dispatching a gather) or replaced (the
  donated scatter); the device-to-host copy and the numpy copy run outside it, so decoding of
  other sessions goes on meanwhile.
* Only the pool is donated, and the scatter's every operand and result are in the ``device``
  memory kind: donating across memory kinds aborts the whole process on XLA (see DESIGN §7).
* The restored rows are copied into the pool by the scatter, so a restored session never
  aliases a tier buffer (``device_put`` of aligned host memory may alias it on CPU).

All three memory kinds exist on JAX's CPU platform, so this backend runs (slowly: ~0.1-0.25x
memcpy per DESIGN §7) and is tested there; ``host_copy`` is the CPU path.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from agentpark.blocks import check_copy, contiguous_runs
from agentpark.engine.base import EngineAdapter
from agentpark.errors import TransferError
from agentpark.tiers.base import HostTier

__all__ = ["DEFAULT_MAX_CHUNK_BYTES", "JaxMemkindTransfer"]

DEFAULT_MAX_CHUNK_BYTES = 256 * 2**20
"""Most bytes of one pool array gathered (or scattered) per step."""

DEVICE = "device"
PINNED_HOST = "pinned_host"


@jax.jit
def _gather_rows(pool: jax.Array, ids: jax.Array) -> jax.Array:
    return jnp.take(pool, ids, axis=0)


@partial(jax.jit, donate_argnums=0)
def _scatter_rows(pool: jax.Array, rows: jax.Array, targets: jax.Array) -> jax.Array:
    return pool.at[targets].set(rows, mode="drop")


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _pow2_ceil(n: int) -> int:
    return 1 << (n - 1).bit_length()


class JaxMemkindTransfer:
    """Moves blocks with ``jax.device_put`` between the device and pinned_host memory kinds."""

    name = "jax_memkind"
    bytes_in_tier = True
    """The parked bytes are in the tier's numpy buffers, row-major, in the pool's layout."""

    def __init__(self, max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES) -> None:
        if max_chunk_bytes <= 0:
            raise ValueError(f"max_chunk_bytes must be positive, got {max_chunk_bytes}")
        self.max_chunk_bytes = max_chunk_bytes

    def _chunk_rows(self, row_nbytes: int) -> int:
        """Rows per chunk: a power of two, so every chunk's bucket is at most this."""
        return _pow2_floor(self.max_chunk_bytes // max(row_nbytes, 1))

    def d2h(
        self,
        engine: EngineAdapter,
        block_ids: Sequence[int],
        tier: HostTier,
        slots: Sequence[int],
        digest: bool = False,
    ) -> str | None:
        """Unfused: returns None, and the mover hashes the tier after the copy."""
        check_copy(block_ids, engine.geometry.num_blocks, slots, tier.capacity_blocks)
        if not block_ids:
            return None
        ids = np.asarray(block_ids, dtype=np.int32)
        for i, buf in enumerate(tier.buffers()):
            step = self._chunk_rows(buf[0].nbytes)
            for start in range(0, len(ids), step):
                chunk = ids[start : start + step]
                n = len(chunk)
                padded = np.full(_pow2_ceil(n), chunk[0], dtype=np.int32)
                padded[:n] = chunk
                try:
                    with engine.lock:
                        pool = engine.kv_pool()[i]
                        _check_pool(pool)
                        gathered = _gather_rows(pool, padded)
                        sharding = pool.sharding.with_memory_kind(PINNED_HOST)
                    del pool
                    on_host = jax.device_put(gathered, sharding)  # the D2H DMA, outside the lock
                    del gathered
                    rows = np.asarray(on_host)
                except TransferError:
                    raise
                except Exception as exc:
                    raise TransferError(f"pause copy (device -> host) failed: {exc}") from exc
                for pos, slot, run in contiguous_runs(slots[start : start + n]):
                    buf[slot : slot + run] = rows[pos : pos + run]
                del rows, on_host
        return None

    def h2d(
        self,
        tier: HostTier,
        slots: Sequence[int],
        engine: EngineAdapter,
        block_ids: Sequence[int],
        digest: bool = False,
    ) -> str | None:
        """Unfused: returns None, and the mover verifies the tier before the copy."""
        check_copy(block_ids, engine.geometry.num_blocks, slots, tier.capacity_blocks)
        if not block_ids:
            return None
        slot_ids = np.asarray(slots, dtype=np.intp)
        out_of_range = engine.geometry.num_blocks
        for i, buf in enumerate(tier.buffers()):
            step = self._chunk_rows(buf[0].nbytes)
            for start in range(0, len(slot_ids), step):
                chunk = slot_ids[start : start + step]
                n = len(chunk)
                size = _pow2_ceil(n)
                padded = np.full(size, chunk[0], dtype=np.intp)
                padded[:n] = chunk
                targets = np.full(size, out_of_range, dtype=np.int32)
                targets[:n] = block_ids[start : start + n]
                rows = np.take(buf, padded, axis=0)  # a fresh array: never the tier buffer
                try:
                    with engine.lock:
                        pool = engine.kv_pool()[i]
                        _check_pool(pool)
                        sharding = pool.sharding.with_memory_kind(DEVICE)
                    del pool
                    on_device = jax.device_put(rows, sharding)  # the H2D DMA, outside the lock
                    with engine.lock:
                        pools = list(engine.kv_pool())
                        pools[i] = _scatter_rows(pools[i], on_device, targets)
                        pools[i].block_until_ready()
                        engine.set_kv_pool(pools)
                except TransferError:
                    raise
                except Exception as exc:
                    raise TransferError(f"restore copy (host -> device) failed: {exc}") from exc
                del rows, on_device, pools
        return None


def _check_pool(pool: jax.Array) -> None:
    kind = pool.sharding.memory_kind
    if kind not in (None, DEVICE):
        raise TransferError(f"the pool is in memory kind {kind!r}; jax_memkind needs 'device'")
    if pool.sharding.shard_shape(pool.shape)[0] != pool.shape[0]:
        raise TransferError(
            f"the pool's block axis is sharded ({pool.sharding}); jax_memkind moves whole "
            "blocks and needs every device to hold a slice of every block"
        )
