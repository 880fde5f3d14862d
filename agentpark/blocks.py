"""Blocks of a paged KV pool: the pool's shape, its block allocator, and runs of block ids.

Everything that counts or addresses blocks (engines, tiers, the DMA core, the session
core) shares these, and nothing here imports JAX, so a tier or the store can be loaded
without the model.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ArraySpec",
    "BlockAllocator",
    "PoolExhaustedError",
    "PoolGeometry",
    "check_copy",
    "contiguous_runs",
    "paired_runs",
]


@dataclass(frozen=True)
class ArraySpec:
    """One pool array, per block: the array's shape is ``(num_blocks, *block_shape)``."""

    block_shape: tuple[int, ...]
    dtype: str  # numpy dtype name, e.g. "uint16" (bfloat16 bits are stored as uint16)

    def __post_init__(self) -> None:
        if any(d <= 0 for d in self.block_shape):
            raise ValueError(f"block_shape dims must be positive, got {self.block_shape}")
        np.dtype(self.dtype)  # raises TypeError on an unknown dtype name

    @property
    def block_nbytes(self) -> int:
        return math.prod(self.block_shape) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class PoolGeometry:
    """Shape of a paged KV pool: every array has the block axis first and ``num_blocks`` rows."""

    num_blocks: int
    block_size: int  # tokens per block
    arrays: tuple[ArraySpec, ...]

    def __post_init__(self) -> None:
        if self.num_blocks <= 0 or self.block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        if not self.arrays:
            raise ValueError("a pool has at least one array")

    @classmethod
    def from_layout(
        cls,
        num_blocks: int,
        block_size: int,
        arrays: Iterable[tuple[Sequence[int], str]],
    ) -> PoolGeometry:
        """The geometry of a layout as the wire carries it: ``(block_shape, dtype)`` per array.

        The one conversion the daemon and both connector workers share, so a layout means
        the same pool on each side. ValueError for a shape or count that is not positive.
        """
        specs = tuple(
            ArraySpec(tuple(int(d) for d in shape), str(dtype)) for shape, dtype in arrays
        )
        return cls(int(num_blocks), int(block_size), specs)

    @property
    def block_nbytes(self) -> int:
        """Bytes one block takes over all pool arrays (what a parked block costs in a tier)."""
        return sum(a.block_nbytes for a in self.arrays)

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.block_nbytes

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)


# ---- runs of block ids -----------------------------------------------------------------


def contiguous_runs(ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """Split ``ids`` into runs of consecutive values: ``(position, first_id, length)``.

    Copies are issued per run so a defragmented range moves as one memcpy.
    """
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            runs.append((start, ids[start], i - start))
            start = i
    return runs


def paired_runs(src: Sequence[int], dst: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """Merge ``src[i] -> dst[i]`` into runs where both sides are consecutive.

    Returns ``(src_offsets, dst_offsets, copy_sizes)``, sizes in blocks.
    """
    if len(src) != len(dst):
        raise ValueError(f"{len(src)} sources but {len(dst)} destinations")
    src_offsets: list[int] = []
    dst_offsets: list[int] = []
    sizes: list[int] = []
    for s, d in zip(src, dst, strict=True):
        if sizes and s == src_offsets[-1] + sizes[-1] and d == dst_offsets[-1] + sizes[-1]:
            sizes[-1] += 1
        else:
            src_offsets.append(int(s))
            dst_offsets.append(int(d))
            sizes.append(1)
    return src_offsets, dst_offsets, sizes


def check_copy(
    block_ids: Sequence[int], num_blocks: int, slots: Sequence[int], capacity: int
) -> None:
    """ValueError unless ``block_ids[i] <-> slots[i]`` pairs up and every id is in range."""
    if len(block_ids) != len(slots):
        raise ValueError(f"{len(block_ids)} block ids but {len(slots)} slots")
    bad = [b for b in block_ids if not 0 <= b < num_blocks]
    if bad:
        raise ValueError(f"block ids {bad[:8]} out of range 0..{num_blocks - 1}")
    bad = [s for s in slots if not 0 <= s < capacity]
    if bad:
        raise ValueError(f"tier slots {bad[:8]} out of range 0..{capacity - 1}")


# ---- the allocator ---------------------------------------------------------------------
class PoolExhaustedError(Exception):
    """Not enough free blocks for an allocation; nothing was allocated."""

    def __init__(self, needed: int, free: int, total: int) -> None:
        super().__init__(f"KV pool exhausted: needed {needed} blocks, {free} free of {total}")
        self.needed = needed
        self.free = free
        self.total = total


class BlockAllocator:
    """Free list plus ownership map over block ids ``0..num_blocks-1``; thread-safe.

    Allocation and freeing are O(1) per block. Owners are any hashable (e.g. a session id or a
    ``("session", id)`` tuple). Blocks are handed out lowest id first from a fresh allocator and
    freed blocks go to the back of the free list, so reuse is FIFO and deterministic.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self._total = num_blocks
        self._lock = threading.Lock()
        self._free: deque[int] = deque(range(num_blocks))
        self._owner_of: dict[int, Hashable] = {}
        # owner -> its blocks in allocation order (a dict used as an ordered set).
        self._blocks_of: dict[Hashable, dict[int, None]] = {}

    @property
    def total(self) -> int:
        return self._total

    @property
    def num_free(self) -> int:
        with self._lock:
            return len(self._free)

    @property
    def num_used(self) -> int:
        with self._lock:
            return len(self._owner_of)

    def allocate(self, owner: Hashable, n: int) -> list[int]:
        """Give ``n`` blocks to ``owner``, all or nothing (raises PoolExhaustedError)."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        if n == 0:
            return []  # and no empty ownership entry
        with self._lock:
            if n > len(self._free):
                raise PoolExhaustedError(needed=n, free=len(self._free), total=self._total)
            blocks = [self._free.popleft() for _ in range(n)]
            owned = self._blocks_of.setdefault(owner, {})
            for b in blocks:
                self._owner_of[b] = owner
                owned[b] = None
            return blocks

    def claim(self, owner: Hashable, blocks: Iterable[int]) -> None:
        """Give ``owner`` exactly these free blocks (re-attaching state persisted elsewhere).

        All or nothing: ValueError if any block is out of range or not free. O(free blocks),
        meant for start-up, not the hot path.
        """
        wanted = list(blocks)
        with self._lock:
            taken = set(wanted)
            if len(taken) != len(wanted):
                raise ValueError(f"duplicate block ids in claim: {wanted}")
            busy = [b for b in wanted if b in self._owner_of or not 0 <= b < self._total]
            if busy:
                raise ValueError(f"blocks not free to claim: {busy[:10]}")
            self._free = deque(b for b in self._free if b not in taken)
            owned = self._blocks_of.setdefault(owner, {})
            for b in wanted:
                self._owner_of[b] = owner
                owned[b] = None
            if not owned:
                del self._blocks_of[owner]

    def free(self, owner: Hashable, blocks: Iterable[int]) -> None:
        """Return exactly ``blocks`` of ``owner`` to the free list.

        Checks every block first, so a bad request (ValueError) frees nothing.
        """
        blocks = list(blocks)
        with self._lock:
            if len(set(blocks)) != len(blocks):
                raise ValueError(f"duplicate block ids in free request: {blocks}")
            for b in blocks:
                if b not in self._owner_of or self._owner_of[b] != owner:
                    raise ValueError(f"block {b} is not owned by {owner!r}")
            owned = self._blocks_of[owner] if blocks else {}
            for b in blocks:
                del self._owner_of[b]
                del owned[b]
                self._free.append(b)
            if blocks and not owned:
                del self._blocks_of[owner]

    def free_all(self, owner: Hashable) -> list[int]:
        """Free every block of ``owner``; returns them (empty if it owned none)."""
        with self._lock:
            blocks = list(self._blocks_of.pop(owner, {}))
            for b in blocks:
                del self._owner_of[b]
                self._free.append(b)
            return blocks

    def owned(self, owner: Hashable) -> list[int]:
        """Blocks of ``owner`` in allocation order."""
        with self._lock:
            return list(self._blocks_of.get(owner, {}))

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (used by tests and debug)."""
        with self._lock:
            free = list(self._free)
            free_set = set(free)
            if len(free_set) != len(free):
                raise AssertionError("free list contains duplicate block ids")
            if len(free) + len(self._owner_of) != self._total:
                raise AssertionError(
                    f"free ({len(free)}) + used ({len(self._owner_of)}) != total ({self._total})"
                )
            both = free_set.intersection(self._owner_of)
            if both:
                raise AssertionError(f"blocks both free and owned: {sorted(both)[:10]}")
            out_of_range = [b for b in free_set.union(self._owner_of) if not 0 <= b < self._total]
            if out_of_range:
                raise AssertionError(f"block ids out of range: {sorted(out_of_range)[:10]}")
            n_by_owner = 0
            for owner, blocks in self._blocks_of.items():
                if not blocks:
                    raise AssertionError(f"owner {owner!r} is listed with no blocks")
                for b in blocks:
                    if self._owner_of.get(b, _MISSING) != owner:
                        raise AssertionError(f"block {b} listed under {owner!r} but owned elsewise")
                n_by_owner += len(blocks)
            if n_by_owner != len(self._owner_of):
                raise AssertionError("ownership maps disagree on the number of used blocks")


_MISSING = object()
