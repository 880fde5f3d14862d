"""The disk tier: the same file layout on a local SSD, for sessions idle a long time.

Writes are fsync'ed before a pause or move into it is reported done.
"""

from __future__ import annotations

from pathlib import Path

from agentpark.blocks import PoolGeometry
from agentpark.enums import Tier
from agentpark.tiers.filetier import FileTier

__all__ = ["DiskTier"]


class DiskTier(FileTier):
    def __init__(
        self,
        path: Path,
        geometry: PoolGeometry,
        capacity_bytes: int,
        model_uid: str,
        owner: Path | None = None,
        *,
        fresh: bool = False,
    ) -> None:
        super().__init__(
            Tier.DISK,
            path,
            geometry,
            capacity_bytes,
            model_uid,
            durable=True,
            populate=False,
            owner=owner,
            fresh=fresh,
        )
