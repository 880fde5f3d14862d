"""The native kernel's copy loop (agentpark.dma.native, ``dma.native_copy``, the default).

Where the kernel is built and every pool array's block is whole 64-byte stripes, a chunk's
blocks are copied in one call per pool array, hashed in the same pass from the source
(the pool on a pause, the tier on a restore), with non-temporal stores: the destination is
not read again soon. The same bytes and the same checksum as numpy_loop's.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np

from agentpark.dma import native
from agentpark.dma.host_copy.strategy import Chunk, PartCopy

__all__ = ["NativeLoop", "copy_native", "takes"]


class NativeLoop:
    """The kernel; ``k`` > 0 hashes in pieces of ``k`` blocks (0: no checksum)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.unit = k or 1

    def gather(self, chunk: Chunk) -> PartCopy:
        rows = np.asarray(chunk.slots, dtype=np.int64)
        return partial(copy_native, chunk.tier, rows, chunk.pool, chunk.ids, self.k, True)

    def scatter(self, chunk: Chunk) -> PartCopy:
        rows = np.asarray(chunk.slots, dtype=np.int64)
        return partial(copy_native, chunk.pool, chunk.ids, chunk.tier, rows, self.k, True)


def takes(dsts: Sequence[np.ndarray], srcs: Sequence[np.ndarray]) -> bool:
    """Whether the kernel copies every one of these array pairs (built, rows it takes)."""
    return all(native.usable(d, s) for d, s in zip(dsts, srcs, strict=True))


def copy_native(
    dsts: Sequence[np.ndarray],
    dst_rows: np.ndarray,
    srcs: Sequence[np.ndarray],
    src_rows: np.ndarray,
    k: int,
    stream: bool,
    lo: int,
    hi: int,
) -> list[bytes]:
    """Positions ``lo..hi`` of a chunk through the native kernel, each array in one call:
    ``dsts[a][dst_rows[i]] = srcs[a][src_rows[i]]``. ``k`` > 0: hashed as it is copied,
    in pieces of ``k`` rows (``lo`` on a piece boundary), from the source; returns the
    piece digests in the order numpy_loop's do (piece by piece, array by array within a
    piece), the same bytes as theirs."""
    rows_out, rows_in = dst_rows[lo:hi], src_rows[lo:hi]
    if not k:
        for dst, src in zip(dsts, srcs, strict=True):
            native.copy_rows(dst, rows_out, src, rows_in, stream=stream)
        return []
    out = np.empty((-(-(hi - lo) // k), len(srcs)), dtype=np.uint64)
    for a, (dst, src) in enumerate(zip(dsts, srcs, strict=True)):
        native.copy_rows(
            dst, rows_out, src, rows_in, piece_rows=k, digests=out[:, a], stream=stream
        )
    blob = out.astype(">u8").tobytes()  # xxhash's digest(): the value, big-endian
    return [blob[i : i + 8] for i in range(0, len(blob), 8)]
