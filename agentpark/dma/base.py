"""The DMA core's contract: move whole KV blocks between the engine's pool and a host tier.

A backend knows pools, block ids and tier slots; it knows no sessions. Both directions are
blocking calls that return only when the bytes are in place (parking runs them in a worker
thread, off the event loop), so a caller frees the source only after a verified copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from agentpark.engine.base import EngineAdapter
from agentpark.tiers.base import HostTier

__all__ = ["Transfer"]


class Transfer(Protocol):
    name: str

    def d2h(
        self, engine: EngineAdapter, block_ids: Sequence[int], tier: HostTier, slots: Sequence[int]
    ) -> None:
        """Copy pool blocks ``block_ids[i]`` into tier slots ``slots[i]``."""
        ...

    def h2d(
        self, tier: HostTier, slots: Sequence[int], engine: EngineAdapter, block_ids: Sequence[int]
    ) -> None:
        """Copy tier slots ``slots[i]`` into pool blocks ``block_ids[i]``."""
        ...
