"""Checksums of parked copies: computed when a copy lands in a tier, checked on restore.

xxh3-64 runs at several times memcpy speed on one core, so checking costs a fraction of the
copy itself; ``agentpark bench transfer`` prints the figure for this host.
"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from agentpark.blocks import contiguous_runs
from agentpark.tiers.base import HostTier

__all__ = ["checksum"]


def checksum(tier: HostTier, slots: Sequence[int]) -> str:
    """Hash of a parked copy: every pool array's rows, in the session's block order."""
    digest = xxhash.xxh3_64()
    for buf in tier.buffers():
        for _pos, slot, n in contiguous_runs(slots):
            digest.update(buf[slot : slot + n].data)
    return f"xxh3:{digest.hexdigest()}"
