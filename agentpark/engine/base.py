"""The engine adapter: what agentpark needs from an inference engine to park its KV cache.

A real engine implements :class:`EngineAdapter` over its own paged KV pool; the daemon ships
:class:`agentpark.engine.reference.ReferenceEngine` so everything runs and is checked end to end
without one. The DMA core moves whole blocks (every array of the pool, all layers) and only
needs :attr:`EngineAdapter.geometry`, :meth:`EngineAdapter.kv_pool` and
:meth:`EngineAdapter.set_kv_pool`, always under :attr:`EngineAdapter.lock`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from agentpark.blocks import ArraySpec, BlockAllocator, PoolGeometry

if TYPE_CHECKING:
    import jax

__all__ = ["ArraySpec", "EngineAdapter", "PoolGeometry"]


@runtime_checkable
class EngineAdapter(Protocol):
    """What an engine exposes to agentpark.

    Attributes:
        geometry: the pool's shape; ``kv_pool()`` returns one array per ``geometry.arrays``.
        allocator: the pool's block allocator (source of truth for blocks in use).
        lock: serialises every read or replacement of the pool arrays (extend, DMA copies).
        vocab_size: number of token ids.
        max_seq_len: longest sequence ``extend`` accepts.
        model_uid: hex hash of model config + pool geometry; parked bytes are only ever
            restored into an engine with the same uid.
    """

    geometry: PoolGeometry
    allocator: BlockAllocator
    lock: threading.RLock
    vocab_size: int
    max_seq_len: int
    model_uid: str

    def kv_pool(self) -> list[jax.Array]:
        """Current pool arrays, block axis first. Hold ``lock`` while using them."""
        ...

    def set_kv_pool(self, arrays: list[jax.Array]) -> None:
        """Install new pool arrays (after a donated scatter replaced the old ones)."""
        ...

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def extend(
        self, block_table: Sequence[int], start_pos: int, tokens: Sequence[int]
    ) -> np.ndarray:
        """Run ``tokens`` at positions ``start_pos..``, writing their KV into ``block_table``.

        ``block_table[i]`` holds positions ``i*block_size .. (i+1)*block_size-1``. Attends
        causally over every position < ``start_pos + len(tokens)`` and returns the float32
        logits ``[vocab_size]`` of the last token. Raises ValueError if the table is too short
        or ``start_pos + len(tokens) > max_seq_len``.
        """
        ...

    def warmup(self) -> None:
        """Compile the common shapes so the first request is not slow."""
        ...

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        ...
