"""The DRAM tier: one preallocated host buffer per pool array, faulted in at start.

Preallocating (and touching every page once) is what makes a pause a memcpy: a fresh
buffer per pause is page-fault bound at a third of memcpy speed on these hosts.
"""

from __future__ import annotations

import numpy as np

from agentpark.engine.base import PoolGeometry
from agentpark.tiers.base import SlotTier

__all__ = ["DramTier"]


class DramTier(SlotTier):
    """Process memory: fast, and gone when the daemon stops."""

    name = "dram"

    def __init__(self, geometry: PoolGeometry, capacity_bytes: int) -> None:
        super().__init__(geometry, capacity_bytes // geometry.block_nbytes)
        self._buffers = [
            np.zeros((self.capacity_blocks, *spec.block_shape), dtype=spec.dtype)
            for spec in geometry.arrays
        ]
        for buf in self._buffers:
            buf.reshape(-1).view(np.uint8)[::4096] = 0  # fault every page in now, not per pause

    def buffers(self) -> list[np.ndarray]:
        return self._buffers
