"""The copy-loop strategy: how one chunk's rows move between pool views and tier buffers.

A pause (gather: pool -> tier) and an in-place restore (scatter: tier -> pool) run the same
three loops, each in its own module: the native kernel (native_loop: copy and hash in one
pass), numpy (numpy_loop: hash a piece, then copy it from cache), and numpy with the hash
on one more thread (hash_thread: spans posted to it). The selector picks one per chunk
from the settings and the arrays. All give the same bytes and the same checksum.

A loop hands back a :data:`PartCopy` for a chunk: positions ``lo..hi`` of it copied (``lo``
on a whole :attr:`CopyLoop.unit`), returning the piece digests it took, in order (none when
not hashing, or when the hash thread hashes). The copy threads each run one part.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["Chunk", "CopyLoop", "PartCopy"]

PartCopy = Callable[[int, int], list[bytes]]


@dataclass(frozen=True)
class Chunk:
    """One chunk of a copy, position ``i`` being pool block ``ids[i]`` and tier slot
    ``slots[i]``; ``offset`` is its first position in the whole copy (the hash thread's
    spans count from the copy's start)."""

    pool: Sequence[np.ndarray]
    """Views over the pool arrays (read on a pause, written on a restore)."""
    tier: Sequence[np.ndarray]
    """The tier's buffers, one per pool array."""
    ids: np.ndarray
    """Pool block ids, ``np.intp``."""
    slots: Sequence[int]
    offset: int


class CopyLoop(Protocol):
    """One way to copy a chunk's rows, and to hash them on the way."""

    unit: int
    """Parts are cut in whole multiples of this many positions (a piece, a span, or 1)."""

    def gather(self, chunk: Chunk) -> PartCopy:
        """Pool rows ``ids`` into tier slots ``slots``: a pause; hashed from the pool."""
        ...

    def scatter(self, chunk: Chunk) -> PartCopy:
        """Tier slots ``slots`` into pool rows ``ids``: a restore; hashed from the tier."""
        ...
