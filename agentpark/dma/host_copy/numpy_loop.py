"""The numpy copy loop: ``np.take`` gathers and ``np.copyto`` / row scatters, xxhash beside.

Used where the native kernel is not built, is turned off (``dma.native_copy = false``) or
does not take the arrays (rows not whole 64-byte stripes). With a checksum, each 1 MiB
piece is hashed just before it is copied, so the copy reads it from L2: hashing the tier's
rows after the copy instead measured 0.72-0.76x memcpy against 0.85-0.93x this way (the
copy's stores evict what the hash would have read). The digest is the same either way:
the same bytes in the same order.

``np.take`` with ``mode="clip"``: the default ``"raise"`` stages ``out`` through a
temporary and runs at a quarter of memcpy speed; ids are bounds-checked once instead
(blocks.check_copy).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np

from agentpark.blocks import contiguous_runs
from agentpark.dma.host_copy.strategy import Chunk, PartCopy
from agentpark.integrity import piece_digest

__all__ = ["NumpyLoop", "gather_rows", "hash_rows", "scatter_rows"]


class NumpyLoop:
    """numpy's copies; ``k`` > 0 hashes in pieces of ``k`` blocks (0: no checksum)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.unit = k or 1

    def gather(self, chunk: Chunk) -> PartCopy:
        return partial(gather_rows, chunk.pool, chunk.tier, chunk.ids, chunk.slots, self.k)

    def scatter(self, chunk: Chunk) -> PartCopy:
        steps = np.diff(chunk.ids) == 1  # where the pool ids run on
        return partial(scatter_rows, chunk.pool, chunk.tier, chunk.ids, steps, chunk.slots, self.k)


def gather_rows(
    views: Sequence[np.ndarray],
    buffers: Sequence[np.ndarray],
    src_ids: np.ndarray,
    slots: Sequence[int],
    k: int,
    lo: int,
    hi: int,
) -> list[bytes]:
    """Copy positions ``lo..hi`` of a chunk from the pool views into the tier buffers.

    ``k`` > 0: piece by piece (``lo`` on a piece boundary), each pool array's rows of a
    piece hashed from the pool just before they are copied; returns the piece digests in
    order (piece by piece, array by array within a piece).
    """
    if not k:
        for pos, slot, n in contiguous_runs(slots[lo:hi]):
            ids = src_ids[lo + pos : lo + pos + n]
            for view, buf in zip(views, buffers, strict=True):
                np.take(view, ids, axis=0, out=buf[slot : slot + n], mode="clip")
        return []
    digests: list[bytes] = []
    for p in range(lo, hi, k):
        q = min(p + k, hi)
        runs = contiguous_runs(slots[p:q])
        sources = contiguous_runs(src_ids[p:q].tolist())
        for view, buf in zip(views, buffers, strict=True):
            digests.append(piece_digest(view, sources))
            for pos, slot, n in runs:
                ids = src_ids[p + pos : p + pos + n]
                np.take(view, ids, axis=0, out=buf[slot : slot + n], mode="clip")
    return digests


def scatter_rows(
    views: Sequence[np.ndarray],
    buffers: Sequence[np.ndarray],
    dst_ids: np.ndarray,
    steps: np.ndarray,
    slots: Sequence[int],
    k: int,
    lo: int,
    hi: int,
) -> list[bytes]:
    """Copy positions ``lo..hi`` of a chunk from the tier buffers into the pool views.

    The mirror of :func:`gather_rows`. ``k`` > 0: piece by piece (``lo`` on a piece
    boundary), each buffer's rows of a piece hashed just before they are copied; returns
    the piece digests in order, the same as :func:`hash_rows`'s. ``steps[i]``:
    ``dst_ids[i + 1] == dst_ids[i] + 1``; a run of tier slots whose pool ids run on too is
    one slice copy, any other a row scatter.
    """
    digests: list[bytes] = []
    for p in range(lo, hi, k or max(1, hi - lo)):
        q = min(p + k, hi) if k else hi
        # One-block pieces (blocks of 1 MiB or more) are the common case: skip the scan.
        runs = [(0, slots[p], 1)] if q - p == 1 else contiguous_runs(slots[p:q])
        for buf, view in zip(buffers, views, strict=True):
            if k:
                digests.append(piece_digest(buf, runs))
            for pos, slot, n in runs:
                at = p + pos
                if n == 1 or steps[at : at + n - 1].all():
                    first = int(dst_ids[at])
                    np.copyto(view[first : first + n], buf[slot : slot + n])
                else:
                    view[dst_ids[at : at + n]] = buf[slot : slot + n]
    return digests


def hash_rows(
    buffers: Sequence[np.ndarray], slots: Sequence[int], k: int, lo: int, hi: int
) -> list[bytes]:
    """Piece digests of tier rows ``slots[lo:hi]`` (``lo`` on a piece boundary)."""
    digests: list[bytes] = []
    for p in range(lo, hi, k):
        runs = contiguous_runs(slots[p : min(p + k, hi)])
        digests.extend(piece_digest(buf, runs) for buf in buffers)
    return digests
