"""Checksums of parked copies: computed when a copy lands in a tier, checked on restore.

The one definition (``xxh3p``), used by the copy loops that hash as they go and by the
independent recomputation here: the session's blocks, in its block order, are cut into
pieces of :func:`piece_blocks` blocks (about :data:`PIECE_BYTES`: the last piece may be
shorter); each pool array's rows of a piece are hashed with xxh3-64, and the checksum is
the xxh3-64 of those 8-byte piece digests, piece by piece, pool array by pool array within
a piece. The value depends only on the bytes, the block order and the pool geometry: not on
the tier slots (a move to another tier keeps it), on copy chunks or on ``dma.copy_threads``
(threads hash whole pieces and the digests are joined in order).

A piece fits in one core's L2 cache, so a copy loop that hashes each piece of the tier right
after writing it (pause) or right before reading it (restore) reads it from cache, not
memory. xxh3 releases the GIL on large buffers, so threads hash in parallel.

Blocks stored by content (agentpark.tiers.slots) carry a digest each
(``xxh3b``, :func:`block_digests`): a block shared by several sessions is verified by its
own digest, whoever reads it.

Copies parked before ``xxh3p`` carry ``xxh3:`` (one stream over each pool array's rows in
turn); they are still verified, by :func:`matches`, the old way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import xxhash

from agentpark.blocks import PoolGeometry, contiguous_runs
from agentpark.tiers.base import HostTier

__all__ = [
    "BLOCK_SCHEME",
    "PIECE_BYTES",
    "SCHEME",
    "block_digests",
    "blocks_intact",
    "checksum",
    "combine",
    "fusable",
    "matches",
    "piece_blocks",
    "piece_digest",
]

SCHEME = "xxh3p"
BLOCK_SCHEME = "xxh3b"
_LEGACY = "xxh3"
PIECE_BYTES = 2**20
"""Bytes per hashed piece (rounded to whole blocks): half of a core's 2 MiB L2 here."""

Runs = Sequence[tuple[int, int, int]]


def piece_blocks(geometry: PoolGeometry) -> int:
    """Blocks per piece for this geometry: ``PIECE_BYTES`` of blocks, at least one."""
    return max(1, PIECE_BYTES // geometry.block_nbytes)


def piece_digest(buf: np.ndarray, runs: Runs) -> bytes:
    """xxh3-64 of ``buf``'s rows of one piece; ``runs`` as from ``contiguous_runs(slots)``."""
    if len(runs) == 1:
        _pos, slot, n = runs[0]
        return xxhash.xxh3_64_digest(buf[slot : slot + n].data)
    digest = xxhash.xxh3_64()
    for _pos, slot, n in runs:
        digest.update(buf[slot : slot + n].data)
    return digest.digest()


def combine(piece_digests: Iterable[bytes]) -> str:
    """The checksum of a copy from its piece digests, in piece order, then array order."""
    return f"{SCHEME}:{xxhash.xxh3_64_hexdigest(b''.join(piece_digests))}"


def checksum(tier: HostTier, slots: Sequence[int]) -> str:
    """Hash of a parked copy, computed from the tier's buffers alone (verify, tests)."""
    k = piece_blocks(tier.geometry)
    buffers = tier.buffers()
    digests: list[bytes] = []
    for i in range(0, len(slots), k):
        runs = contiguous_runs(slots[i : i + k])
        digests.extend(piece_digest(buf, runs) for buf in buffers)
    return combine(digests)


def fusable(expected: str) -> bool:
    """Whether ``expected`` is of the definition a copy loop can compute as it copies."""
    return expected.startswith(f"{SCHEME}:")


def matches(tier: HostTier, slots: Sequence[int], expected: str) -> bool:
    """Whether the copy in ``slots`` of ``tier`` still has checksum ``expected``."""
    if expected.startswith(f"{_LEGACY}:"):
        return _legacy_checksum(tier, slots) == expected
    return checksum(tier, slots) == expected


def _legacy_checksum(tier: HostTier, slots: Sequence[int]) -> str:
    digest = xxhash.xxh3_64()
    for buf in tier.buffers():
        for _pos, slot, n in contiguous_runs(slots):
            digest.update(buf[slot : slot + n].data)
    return f"{_LEGACY}:{digest.hexdigest()}"


def block_digests(tier: HostTier, slots: Sequence[int]) -> list[str]:
    """The digest of each slot's block: xxh3-64 over its rows of every pool array in turn.

    Independent of the slot (a block moved to another tier or slot keeps it) and of who
    else holds the block.
    """
    buffers = tier.buffers()
    digests: list[str] = []
    for slot in slots:
        digest = xxhash.xxh3_64()
        for buf in buffers:
            digest.update(buf[slot].data)
        digests.append(f"{BLOCK_SCHEME}:{digest.hexdigest()}")
    return digests


def blocks_intact(tier: HostTier, slots: Sequence[int], expected: Sequence[str | None]) -> bool:
    """Whether every slot's block still has its digest (a None expects nothing)."""
    got = block_digests(tier, [s for s, e in zip(slots, expected, strict=True) if e is not None])
    want = [e for e in expected if e is not None]
    return got == want
