"""A host tier: preallocated blocks in host memory plus the bookkeeping of who holds which.

The bookkeeping (slot allocation, capacity) lives here; moving bytes in and out of the
buffers is the DMA core's job (agentpark.dma). A tier's slot ``s`` is row ``s`` of every
buffer, one buffer per pool array, so a parked block keeps the pool's own layout.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

import numpy as np

from agentpark.blocks import BlockAllocator, PoolExhaustedError, PoolGeometry
from agentpark.enums import Medium
from agentpark.errors import TierFullError

__all__ = ["BackendHeldTier", "HostTier", "SlotTier"]


class HostTier(Protocol):
    """What parking and the DMA core need from a tier."""

    name: str
    geometry: PoolGeometry
    persistent: bool  # survives a daemon restart (shm, disk)

    @property
    def medium(self) -> Medium: ...

    @property
    def capacity_blocks(self) -> int: ...

    @property
    def used_blocks(self) -> int: ...

    def buffers(self) -> list[np.ndarray]: ...

    def allocate(self, owner: Hashable, n: int) -> list[int]: ...

    def free(self, owner: Hashable) -> list[int]: ...

    def claim(self, owner: Hashable, slots: list[int]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class SlotTier:
    """Slot bookkeeping shared by every tier: a free list over ``capacity_blocks`` slots."""

    name = "tier"
    persistent = False
    medium = Medium.HOST

    def __init__(self, geometry: PoolGeometry, capacity_blocks: int) -> None:
        self.geometry = geometry
        self._capacity_blocks = capacity_blocks
        # BlockAllocator needs at least one slot; a zero-capacity tier refuses every pause.
        self._slots = BlockAllocator(capacity_blocks) if capacity_blocks else None

    @property
    def capacity_blocks(self) -> int:
        return self._capacity_blocks

    @property
    def used_blocks(self) -> int:
        return self._slots.num_used if self._slots else 0

    @property
    def capacity_bytes(self) -> int:
        return self._capacity_blocks * self.geometry.block_nbytes

    @property
    def used_bytes(self) -> int:
        return self.used_blocks * self.geometry.block_nbytes

    def allocate(self, owner: Hashable, n: int) -> list[int]:
        """Reserve ``n`` slots for ``owner``, all or none (TierFullError names the numbers)."""
        if n == 0:
            return []
        try:
            if self._slots is None:
                raise PoolExhaustedError(n, 0, 0)
            return self._slots.allocate(owner, n)
        except PoolExhaustedError as exc:
            block = self.geometry.block_nbytes
            raise TierFullError(
                f"{self.name} tier is full: needs {n} blocks ({n * block} bytes), "
                f"{exc.free} of {exc.total} free",
                tier=self.name,
                needed_blocks=n,
                free_blocks=exc.free,
                capacity_blocks=exc.total,
            ) from None

    def free(self, owner: Hashable) -> list[int]:
        """Release every slot ``owner`` holds."""
        return self._slots.free_all(owner) if self._slots else []

    def claim(self, owner: Hashable, slots: list[int]) -> None:
        """Re-attach slots recorded in SQLite to their session (start-up only)."""
        if slots and self._slots is None:
            raise ValueError(f"{self.name} tier has no slots to claim")
        if self._slots is not None:
            self._slots.claim(owner, slots)

    def flush(self) -> None:
        """Make copies durable; only the disk tier has anything to do."""

    def close(self) -> None:
        """Release the tier's memory or file."""

    def check_invariants(self) -> None:
        if self._slots:
            self._slots.check_invariants()


class BackendHeldTier(SlotTier):
    """Slots whose bytes a DMA backend keeps in its own host memory (tpu_sync).

    Slot ``s`` is the backend's host block ``s``; agentpark only does the bookkeeping, so
    these bytes can be neither read, checksummed nor moved to another tier.

    ``persistent`` when the backend keeps them where a restart finds them again (tpu_sync's
    shm mode); then ``reattached`` / ``attach_problem`` say what start-up found, as for the
    file tiers, and recovery re-claims the slots SQLite recorded.
    """

    def __init__(
        self, name: str, geometry: PoolGeometry, capacity_blocks: int, *, persistent: bool = False
    ) -> None:
        super().__init__(geometry, capacity_blocks)
        self.name = name
        self.persistent = persistent
        self.reattached = False
        self.attach_problem: str | None = None

    def buffers(self) -> list[np.ndarray]:
        raise TypeError(f"the {self.name} tier's bytes live in the DMA backend, not in agentpark")
