"""A host tier: preallocated blocks in host memory plus the bookkeeping of who holds which.

The bookkeeping (slot allocation, capacity) lives here; moving bytes in and out of the
buffers is the DMA core's job (agentpark.dma). A tier's slot ``s`` is row ``s`` of every
buffer, one buffer per pool array, so a parked block keeps the pool's own layout.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

import numpy as np

from agentpark.blocks import PoolExhaustedError, PoolGeometry
from agentpark.enums import Medium
from agentpark.errors import TierFullError
from agentpark.tiers.slots import Reservation, SlotListener, SlotStore

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

    @property
    def cached_blocks(self) -> int: ...

    def reserve(self, owner: Hashable, keys: Sequence[Hashable | None]) -> Reservation: ...

    def allocate(self, owner: Hashable, n: int) -> list[int]: ...

    def seal(
        self,
        owner: Hashable,
        digests: dict[int, str | None],
        *,
        announce_as: Hashable | None = None,
    ) -> None: ...

    def hold(self, owner: Hashable, slots: Sequence[int]) -> None: ...

    def hand_over(self, owner: Hashable, to: Hashable) -> None: ...

    def find(self, keys: Sequence[Hashable]) -> list[int]: ...

    def digest_of(self, slot: int) -> str | None: ...

    def forget(self, slots: Sequence[int]) -> None: ...

    def free(self, owner: Hashable, *, cache: bool = False) -> list[int]: ...

    def claim(
        self,
        owner: Hashable,
        slots: list[int],
        keys: Sequence[Hashable | None] | None = None,
        digests: Sequence[str | None] | None = None,
    ) -> None: ...

    def add_listener(self, listener: SlotListener) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class SlotTier:
    """Slot bookkeeping shared by every tier: a store of blocks addressed by content
    (agentpark.tiers.slots) over ``capacity_blocks`` slots."""

    name = "tier"
    persistent = False
    medium = Medium.HOST

    def __init__(self, geometry: PoolGeometry, capacity_blocks: int) -> None:
        self.geometry = geometry
        self._capacity_blocks = capacity_blocks
        # A zero-capacity tier refuses every pause.
        self._slots = SlotStore(capacity_blocks) if capacity_blocks else None

    @property
    def capacity_blocks(self) -> int:
        return self._capacity_blocks

    @property
    def used_blocks(self) -> int:
        """Slots some session (or load) holds; cached blocks are room, not use."""
        return self._slots.num_used if self._slots else 0

    @property
    def cached_blocks(self) -> int:
        """Blocks no session holds, kept findable by key until their room is needed."""
        return self._slots.num_cached if self._slots else 0

    @property
    def capacity_bytes(self) -> int:
        return self._capacity_blocks * self.geometry.block_nbytes

    @property
    def used_bytes(self) -> int:
        return self.used_blocks * self.geometry.block_nbytes

    def reserve(self, owner: Hashable, keys: Sequence[Hashable | None]) -> Reservation:
        """A slot per block for ``owner``: shared where the tier holds that key, else fresh
        (to be copied, then :meth:`seal` ed). All or none (TierFullError names the numbers)."""
        if not keys:
            return Reservation([], [], [])
        try:
            if self._slots is None:
                raise PoolExhaustedError(len(keys), 0, 0)
            return self._slots.reserve(owner, keys)
        except PoolExhaustedError as exc:
            block = self.geometry.block_nbytes
            n = exc.needed
            raise TierFullError(
                f"{self.name} tier is full: needs {n} blocks ({n * block} bytes), "
                f"{exc.free} of {exc.total} free",
                tier=self.name,
                needed_blocks=n,
                free_blocks=exc.free,
                capacity_blocks=exc.total,
            ) from None

    def allocate(self, owner: Hashable, n: int) -> list[int]:
        """Reserve ``n`` fresh private slots for ``owner``, all or none."""
        return self.reserve(owner, [None] * n).slots

    def seal(
        self,
        owner: Hashable,
        digests: dict[int, str | None],
        *,
        announce_as: Hashable | None = None,
    ) -> None:
        """``owner``'s fresh slots hold their committed copies (digest by slot); the
        listeners hear ``announce_as`` as their owner when given (SlotStore.seal)."""
        if self._slots is not None:
            self._slots.seal(owner, digests, announce_as=announce_as)

    def hold(self, owner: Hashable, slots: Sequence[int]) -> None:
        """Keep sealed slots for ``owner`` (a load reading them) until it frees them."""
        if slots:
            if self._slots is None:
                raise ValueError(f"{self.name} tier has no slots")
            self._slots.hold(owner, slots)

    def hand_over(self, owner: Hashable, to: Hashable) -> None:
        """``owner``'s slots become ``to``'s (SlotStore.hand_over)."""
        if self._slots is not None:
            self._slots.hand_over(owner, to)

    def find(self, keys: Sequence[Hashable]) -> list[int]:
        """Slots of the longest prefix of ``keys`` this tier holds."""
        return self._slots.find(keys) if self._slots else []

    def digest_of(self, slot: int) -> str | None:
        return self._slots.digest(slot) if self._slots else None

    def forget(self, slots: Sequence[int]) -> None:
        """These slots' bytes failed their checksum: never share them again."""
        if self._slots is not None:
            self._slots.forget(slots)

    def free(self, owner: Hashable, *, cache: bool = False) -> list[int]:
        """Release every slot ``owner`` holds (a shared one stays for its other holders);
        ``cache``: keep its blocks findable by content until their room is needed."""
        return self._slots.release(owner, cache=cache) if self._slots else []

    def claim(
        self,
        owner: Hashable,
        slots: list[int],
        keys: Sequence[Hashable | None] | None = None,
        digests: Sequence[str | None] | None = None,
    ) -> None:
        """Re-attach slots recorded in SQLite to their session (start-up only)."""
        if slots and self._slots is None:
            raise ValueError(f"{self.name} tier has no slots to claim")
        if self._slots is not None:
            self._slots.claim(owner, slots, keys, digests)

    def add_listener(self, listener: SlotListener) -> None:
        """Hear this tier's keys become and stop being findable (agentpark.kvevents)."""
        if self._slots is not None:
            self._slots.listeners.append(listener)

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
