"""The shm tier: a file in /dev/shm, so parked sessions survive a daemon crash or upgrade.

Memory speed (it is RAM), not durable across a reboot. Pages are populated at start so a
pause never page-faults its way through the copy.
"""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

from agentpark.blocks import PoolGeometry
from agentpark.enums import Tier
from agentpark.tiers.filetier import FileTier

__all__ = ["ShmTier", "default_shm_path"]


def default_shm_path(state_dir: Path) -> Path:
    """One file per state dir: /dev/shm/agentpark-<host>-<first 12 hex of sha256(state dir)>.

    Keyed on the resolved state dir, not the port: two daemons with their own state dirs
    never share a file (``--port 0`` included), and a daemon restarted on another port
    finds its parked sessions again.
    """
    digest = hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()[:12]
    return Path("/dev/shm") / f"agentpark-{socket.gethostname()}-{digest}"


class ShmTier(FileTier):
    def __init__(
        self,
        path: Path,
        geometry: PoolGeometry,
        capacity_bytes: int,
        model_uid: str,
        owner: Path | None = None,
    ) -> None:
        super().__init__(
            Tier.SHM,
            path,
            geometry,
            capacity_bytes,
            model_uid,
            durable=False,
            populate=True,
            owner=owner,
        )
