"""The pause (d2h): pool blocks gathered straight into the preallocated tier buffer.

``np.asarray(pool)`` is a zero-copy view on JAX's CPU backend, so parking is a gather-copy
with the chunk's copy loop (agentpark.dma.host_copy.selector) from those views into the
tier's rows, each chunk under the engine lock. The views are dropped before the lock is
let go: a live view would make the next donating step copy the whole pool.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentpark.dma.host_copy.run import CopyRun
from agentpark.dma.host_copy.strategy import Chunk
from agentpark.engine.base import EngineAdapter

__all__ = ["pause"]


def pause(
    run: CopyRun,
    engine: EngineAdapter,
    block_ids: Sequence[int],
    buffers: Sequence[np.ndarray],
    slots: Sequence[int],
) -> list[bytes]:
    """The copy, chunk by chunk; the fused piece digests (none with the hash thread)."""
    pieces: list[bytes] = []
    for lo, hi in run.chunks(len(slots)):
        ids = np.asarray(block_ids[lo:hi], dtype=np.intp)
        with engine.lock:
            views = [np.asarray(arr) for arr in engine.kv_pool()]  # zero-copy on CPU
            try:
                loop = run.loop(buffers, views)
                chunk = Chunk(views, buffers, ids, slots[lo:hi], lo)
                pieces.extend(run.copy(loop.gather(chunk), hi - lo, loop.unit))
            finally:
                views.clear()
        run.chunk_done(hi - lo)
    return pieces
