"""The shm tier: a file in /dev/shm, so parked sessions survive a daemon crash or upgrade.

Memory speed (it is RAM), not durable across a reboot. Pages are populated at start so a
pause never page-faults its way through the copy.

Where: by default in a private folder of this daemon's, ``/dev/shm/agentpark-<random>``
(mode 0700, made by ``mkdtemp``), whose name is recorded in the state dir
(``<state_dir>/shm-dir``). Nobody can predict that name before it exists, nor plant a file
or a symlink in it afterwards, so nothing another user does in /dev/shm can stop a start
or reach the file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import stat
import tempfile
from pathlib import Path

from agentpark.blocks import PoolGeometry
from agentpark.enums import Tier
from agentpark.statedir import private_dir, write_private
from agentpark.tiers.filetier import FileTier

__all__ = [
    "SHM_DIR_RECORD",
    "SHM_ROOT",
    "ShmTier",
    "default_shm_path",
    "legacy_shm_path",
    "shm_dir",
]

log = logging.getLogger(__name__)

SHM_ROOT = Path("/dev/shm")
SHM_DIR_RECORD = "shm-dir"
SHM_FILE = "shm-tier"


def _usable(folder: Path, root: Path) -> bool:
    """A folder of ours in ``root``, 0700, not a symlink: safe to keep using."""
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return (
        folder.parent == root
        and stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.geteuid()
        and not st.st_mode & 0o077
    )


def legacy_shm_path(state_dir: Path, root: Path) -> Path:
    """Where older daemons put the file: a predictable name (host, hash of the state dir)."""
    digest = hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()[:12]
    return root / f"agentpark-{socket.gethostname()}-{digest}"


def _adopt_legacy(state_dir: Path, folder: Path, root: Path) -> None:
    """Move an older daemon's files into ``folder`` when they are plainly ours (a regular
    file of this uid, 0600): its parked sessions are kept across the upgrade. A symlink
    or a stranger's file at that predictable name is left where it is."""
    legacy = legacy_shm_path(state_dir, root)
    pairs = [
        (legacy, SHM_FILE),
        (legacy.with_name(f"{legacy.name}-vllm"), "vllm-pool"),
        (legacy.with_name(f"{legacy.name}-vllm.held.json"), "vllm-pool.held.json"),
    ]
    for old, new in pairs:
        try:
            st = os.lstat(old)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
            os.rename(old, folder / new)
            log.info("moved %s of an older agentpark into %s", old, folder / new)


def shm_dir(state_dir: Path, root: Path = SHM_ROOT) -> Path:
    """This state dir's private folder under /dev/shm: the recorded one while it is still
    ours and private, else a new one (recorded, and logged)."""
    record = Path(state_dir) / SHM_DIR_RECORD
    try:
        folder = Path(record.read_text().strip())
    except (FileNotFoundError, UnicodeDecodeError):
        folder = None
    if folder is not None and _usable(folder, root):
        return folder
    private_dir(Path(state_dir))
    made = Path(tempfile.mkdtemp(prefix="agentpark-", dir=root))  # 0700, unguessable
    if folder is None:
        _adopt_legacy(state_dir, made, root)
    else:
        log.warning("shm folder %s is gone or not private any more; using a new one", folder)
    write_private(record, f"{made}\n")
    log.info("shm folder of %s: %s (recorded in %s)", state_dir, made, record)
    return made


def default_shm_path(state_dir: Path) -> Path:
    """The shm tier's file when ``tiers.shm.path`` is unset: in :func:`shm_dir`."""
    return shm_dir(state_dir) / SHM_FILE


class ShmTier(FileTier):
    def __init__(
        self,
        path: Path,
        geometry: PoolGeometry,
        capacity_bytes: int,
        model_uid: str,
        owner: Path | None = None,
        *,
        fresh: bool = False,
        sparse: bool = False,
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
            fresh=fresh,
            sparse=sparse,
        )
