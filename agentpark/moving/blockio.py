"""A block on the wire: its rows of every pool array in turn, as the tier holds them.

The wire form of a block hashes to its ``xxh3b`` digest (agentpark.integrity.block_digests
streams the same rows in the same order), so a block is verified on arrival without a copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xxhash

from agentpark.integrity import BLOCK_SCHEME
from agentpark.tiers.base import HostTier

__all__ = ["read_blocks", "wire_digest", "write_blocks"]


def read_blocks(tier: HostTier, slots: Sequence[int], out: bytearray | None = None) -> memoryview:
    """The wire form of ``slots``' blocks, one after the other (into ``out`` if given).

    One gather per pool array (not one copy per block and array): a chunk of 64 blocks of
    a 16-array pool is 16 numpy calls instead of 1024."""
    buffers = tier.buffers()
    block = sum(buf[0].nbytes for buf in buffers)
    size = block * len(slots)
    if out is None or len(out) < size:
        out = bytearray(size)
    rows = np.frombuffer(out, dtype=np.uint8, count=size).reshape(len(slots), block)
    index = np.asarray(slots, dtype=np.intp)
    pos = 0
    for buf in buffers:
        n = buf[0].nbytes
        rows[:, pos : pos + n] = buf[index].reshape(len(slots), -1).view(np.uint8)
        pos += n
    return memoryview(out)[:size]


def wire_digest(data: memoryview | bytes) -> str:
    """The ``xxh3b`` digest of one block in wire form."""
    return f"{BLOCK_SCHEME}:{xxhash.xxh3_64_hexdigest(data)}"


def write_blocks(
    tier: HostTier, slots: Sequence[int], data: memoryview | bytes, at: Sequence[int]
) -> None:
    """Put the blocks at positions ``at`` of ``data`` (wire form, one after the other) into
    ``slots`` of every pool array of ``tier``: one scatter per array."""
    if not slots:
        return
    buffers = tier.buffers()
    block = sum(buf[0].nbytes for buf in buffers)
    src = np.frombuffer(data, dtype=np.uint8)
    rows = src.reshape(len(src) // block, block)[np.asarray(at, dtype=np.intp)]
    index = np.asarray(slots, dtype=np.intp)
    pos = 0
    for buf in buffers:
        n = buf[0].nbytes
        part = np.ascontiguousarray(rows[:, pos : pos + n])
        buf[index] = part.view(buf.dtype).reshape((len(slots), *buf.shape[1:]))
        pos += n
