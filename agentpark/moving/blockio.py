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

__all__ = ["read_blocks", "wire_digest", "write_block"]


def read_blocks(tier: HostTier, slots: Sequence[int], out: bytearray | None = None) -> memoryview:
    """The wire form of ``slots``' blocks, one after the other (into ``out`` if given)."""
    buffers = tier.buffers()
    block = sum(buf[0].nbytes for buf in buffers)
    size = block * len(slots)
    if out is None or len(out) < size:
        out = bytearray(size)
    view = np.frombuffer(out, dtype=np.uint8, count=size)
    pos = 0
    for slot in slots:
        for buf in buffers:
            row = buf[slot]
            n = row.nbytes
            view[pos : pos + n] = row.reshape(-1).view(np.uint8)
            pos += n
    return memoryview(out)[:size]


def wire_digest(data: memoryview | bytes) -> str:
    """The ``xxh3b`` digest of one block in wire form."""
    return f"{BLOCK_SCHEME}:{xxhash.xxh3_64_hexdigest(data)}"


def write_block(tier: HostTier, slot: int, data: memoryview | bytes) -> None:
    """Put one block's wire form into ``slot`` of every pool array of ``tier``."""
    src = np.frombuffer(data, dtype=np.uint8)
    pos = 0
    for buf in tier.buffers():
        row = buf[slot]
        n = row.nbytes
        row.reshape(-1).view(np.uint8)[:] = src[pos : pos + n]
        pos += n
