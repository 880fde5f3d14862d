"""The DMA core's contract: move whole KV blocks between the engine's pool and a host tier.

A backend knows pools, block ids and tier slots; it knows no sessions. Both directions are
blocking calls that return only when the bytes are in place (parking runs them in a worker
thread, off the event loop), so a caller frees the source only after a verified copy.

``digest=True`` asks for the checksum (agentpark.integrity) of the tier side of the copy,
taken while copying: host_copy hashes each piece while it is in cache, on the copying
thread or (``dma.hash_thread``) on a second one. A backend that
cannot returns None, and the mover hashes the tier itself (after a pause's copy, before a
restore's).
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
        self,
        engine: EngineAdapter,
        block_ids: Sequence[int],
        tier: HostTier,
        slots: Sequence[int],
        digest: bool = False,
    ) -> str | None:
        """Copy pool blocks ``block_ids[i]`` into tier slots ``slots[i]``.

        With ``digest``: the checksum of the tier's copy, or None if not computed.
        """
        ...

    def h2d(
        self,
        tier: HostTier,
        slots: Sequence[int],
        engine: EngineAdapter,
        block_ids: Sequence[int],
        digest: bool = False,
    ) -> str | None:
        """Copy tier slots ``slots[i]`` into pool blocks ``block_ids[i]``.

        With ``digest``: the checksum of the tier's copy as read, or None if not computed;
        the caller must not use the blocks if it differs from the one stored at the pause.
        """
        ...
