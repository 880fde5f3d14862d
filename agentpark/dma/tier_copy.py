"""Host-to-host moves between tiers (dram -> shm on drain, shm -> disk on demotion).

Both sides are preallocated host buffers in the pool's layout, so a move is one memcpy
per run of slots that is consecutive on both sides.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentpark.tiers.base import HostTier

__all__ = ["copy_between_tiers"]


def copy_between_tiers(
    src: HostTier, src_slots: Sequence[int], dst: HostTier, dst_slots: Sequence[int]
) -> None:
    """Copy ``src`` slot ``src_slots[i]`` to ``dst`` slot ``dst_slots[i]`` for every array."""
    if len(src_slots) != len(dst_slots):
        raise ValueError(f"{len(src_slots)} source slots but {len(dst_slots)} destination slots")
    for src_buf, dst_buf in zip(src.buffers(), dst.buffers(), strict=True):
        i = 0
        while i < len(src_slots):
            n = 1
            while (
                i + n < len(src_slots)
                and src_slots[i + n] == src_slots[i] + n
                and dst_slots[i + n] == dst_slots[i] + n
            ):
                n += 1
            s, d = src_slots[i], dst_slots[i]
            np.copyto(dst_buf[d : d + n], src_buf[s : s + n])
            i += n
