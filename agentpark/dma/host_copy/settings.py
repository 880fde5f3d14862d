"""host_copy's settings as one copy sees them, and how they cut a copy into chunks and parts.

A copy goes in chunks of about ``chunk_bytes``, each under the engine lock and the lock let
go between chunks, so other sessions keep decoding while a large session moves: the bytes
in flight at any moment are bounded by one chunk. A chunk is cut into parts, one per copy
thread (``copy_threads``), in whole units: pieces when hashing (integrity.piece_blocks), so
the checksum is the same for any thread count; spans with the hash thread.

The settings are read once per copy (:class:`CopySettings`, a snapshot): a flag changed
between copies (the bench flips them for its A/B tables) takes effect at the next one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from agentpark.blocks import PoolGeometry
from agentpark.integrity import piece_blocks

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "HASH_DEPTH",
    "HASH_SPAN_BYTES",
    "MAX_COPY_THREADS",
    "CopySettings",
    "parts",
]

DEFAULT_CHUNK_BYTES = 64 * 2**20
MAX_COPY_THREADS = 64
# dma.hash_thread: the copier posts spans of this much to the hash thread, which may be at
# most HASH_DEPTH spans behind (what it hashes is then still in the L3).
HASH_SPAN_BYTES = 4 * 2**20
HASH_DEPTH = 2


@dataclass(frozen=True)
class CopySettings:
    """The four flags and the sizes one copy runs with (HostCopyTransfer's, at its start)."""

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    copy_threads: int = 1
    hash_thread: bool = False
    hash_span_bytes: int = HASH_SPAN_BYTES
    in_place: bool = True
    native_copy: bool = True

    def chunk_blocks(self, geometry: PoolGeometry) -> int:
        """Blocks per chunk: about ``chunk_bytes``, in whole hash pieces."""
        return _whole_pieces(self.chunk_bytes, geometry)

    def span_blocks(self, geometry: PoolGeometry) -> int:
        """Blocks per span posted to the hash thread: whole pieces, at least one."""
        return _whole_pieces(self.hash_span_bytes, geometry)

    def chunks(self, geometry: PoolGeometry, n: int) -> list[tuple[int, int]]:
        """``[lo, hi)`` positions of each chunk of an ``n``-block copy."""
        per = self.chunk_blocks(geometry)
        return [(lo, min(lo + per, n)) for lo in range(0, n, per)]


def parts(lo: int, hi: int, unit: int, count: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut into at most ``count`` ranges of whole ``unit``s, in order."""
    units = -(-(hi - lo) // unit)
    count = max(1, min(count, units))
    cuts = [lo + min(hi - lo, (units * i // count) * unit) for i in range(count + 1)]
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


def _whole_pieces(nbytes: int, geometry: PoolGeometry) -> int:
    k = piece_blocks(geometry)
    return max(k, nbytes // geometry.block_nbytes // k * k)
