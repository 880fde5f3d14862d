"""host_copy: the CPU backend, where the pool already lives in host memory.

Pause: ``np.asarray(pool)`` is a zero-copy view on JAX's CPU backend, so parking is one
gather-copy per run of tier slots straight into the preallocated tier buffer.

Restore: a jitted scatter with the pool donated (in place). Its update operand is a window
of the tier buffer itself (zero-copy: JAX aliases aligned host memory), sized to a power of
two so few shapes are ever compiled; rows of the window that are not being restored get an
out-of-range block id and are dropped. Gathering inside the jit instead runs at a tenth of
memcpy speed on XLA:CPU, which is why the window trick exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import jax
import numpy as np

from agentpark.dma.base import contiguous_runs
from agentpark.engine.base import EngineAdapter
from agentpark.errors import TransferError
from agentpark.tiers.base import HostTier

__all__ = ["HostCopyTransfer"]


@partial(jax.jit, donate_argnums=0)
def _scatter_rows(pool: jax.Array, window: jax.Array, targets: jax.Array) -> jax.Array:
    return pool.at[targets].set(window, mode="drop")


def _bucket(n: int, cap: int) -> int:
    return min(1 << (n - 1).bit_length(), cap)


class HostCopyTransfer:
    """Moves blocks with memcpy-class host copies; the default on the CPU platform."""

    name = "host_copy"

    def d2h(
        self, engine: EngineAdapter, block_ids: Sequence[int], tier: HostTier, slots: Sequence[int]
    ) -> None:
        _check(block_ids, slots)
        if not block_ids:
            return
        src_ids = np.asarray(block_ids, dtype=np.intp)
        with engine.lock:
            for arr, buf in zip(engine.kv_pool(), tier.buffers(), strict=True):
                view = np.asarray(arr)  # zero-copy on the CPU platform
                for pos, slot, n in contiguous_runs(slots):
                    np.take(view, src_ids[pos : pos + n], axis=0, out=buf[slot : slot + n])
                del view

    def h2d(
        self, tier: HostTier, slots: Sequence[int], engine: EngineAdapter, block_ids: Sequence[int]
    ) -> None:
        _check(block_ids, slots)
        if not block_ids:
            return
        out_of_range = engine.geometry.num_blocks
        with engine.lock:
            pool = list(engine.kv_pool())
            for pos, slot, n in contiguous_runs(slots):
                for i, buf in enumerate(tier.buffers()):
                    size = _bucket(n, buf.shape[0])
                    first = min(slot, buf.shape[0] - size)
                    targets = np.full(size, out_of_range, dtype=np.int32)
                    offset = slot - first
                    targets[offset : offset + n] = block_ids[pos : pos + n]
                    try:
                        pool[i] = _scatter_rows(pool[i], buf[first : first + size], targets)
                    except Exception as exc:
                        raise TransferError(f"restore scatter failed: {exc}") from exc
            jax.block_until_ready(pool)  # type: ignore[no-untyped-call]
            engine.set_kv_pool(pool)


def _check(block_ids: Sequence[int], slots: Sequence[int]) -> None:
    if len(block_ids) != len(slots):
        raise ValueError(f"{len(block_ids)} block ids but {len(slots)} slots")
