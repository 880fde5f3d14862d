"""A tier in one preallocated file, mapped into memory: the shared half of shm and disk.

Layout: a 4 KiB header, then one region per pool array (4 KiB aligned) of
``capacity_blocks`` rows in the pool's own layout. The header is the magic ``AGPKTIER``,
a little-endian uint32 format version and uint32 length, then JSON naming the model uid,
the block geometry, the dtypes and the capacity (and, when the daemon gave it, the state dir
that owns the file: ``agentpark db cleanup`` reads it). Which slots belong to which session is
not in the file: it lives in SQLite (``sessions.parked_handle``), written in the same
transaction that reports the pause done.

On start an existing file is re-attached only if it is ours (owner, mode 0600) and its
header matches this daemon exactly. Anything else is refused loudly: the file is moved
aside (never deleted), the reason is logged and kept in ``attach_problem``, and the tier
starts empty; sessions that were parked in it become LOST and are recomputed.

While a daemon has the file open it holds an exclusive ``flock`` on it: a second daemon
configured onto the same file is refused at start (ConfigError), before it looks at it.

A re-attached file whose slots hold bytes (:meth:`FileTier.holds_data`) next to a database
that knows no session at all (a new or emptied agentpark.db) is an orphan: start-up
refuses it unless told to adopt it (keep the file, every slot free) or discard it
(:meth:`FileTier.discard`: moved aside, a new file made), see ``reliability.tier_files``.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import mmap
import os
import struct
import time
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentpark.blocks import PoolGeometry
from agentpark.errors import ConfigError, TierFullError
from agentpark.tiers.base import SlotTier

__all__ = ["FORMAT_VERSION", "MAGIC", "FileTier", "orphaned", "read_header"]

log = logging.getLogger(__name__)

MAGIC = b"AGPKTIER"
FORMAT_VERSION = 1
HEADER_BYTES = 4096
_ALIGN = 4096
_PREFIX = struct.Struct("<8sII")


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def read_header(path: Path) -> dict[str, Any]:
    """The header of a tier file; ValueError naming what is wrong with it."""
    with path.open("rb") as f:
        raw = f.read(HEADER_BYTES)
    if len(raw) < _PREFIX.size:
        raise ValueError(f"file is {len(raw)} bytes, shorter than a header")
    magic, version, length = _PREFIX.unpack_from(raw)
    if magic != MAGIC:
        raise ValueError(f"magic is {magic!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise ValueError(f"format version is {version}, this daemon reads {FORMAT_VERSION}")
    body = raw[_PREFIX.size : _PREFIX.size + length]
    header: dict[str, Any] = json.loads(body)
    header["version"] = version
    return header


class FileTier(SlotTier):
    """Slots in a mapped file; survives the daemon (shm: until reboot, disk: for good)."""

    persistent = True

    def __init__(
        self,
        name: str,
        path: Path,
        geometry: PoolGeometry,
        capacity_bytes: int,
        model_uid: str,
        *,
        durable: bool,
        populate: bool,
        owner: Path | None = None,
    ) -> None:
        super().__init__(geometry, capacity_bytes // geometry.block_nbytes)
        self.name = name
        self.path = path
        # The state dir of the daemon the file belongs to, recorded in the header so
        # `agentpark db cleanup` can tell a file whose state dir is gone (an orphan).
        self.owner = None if owner is None else Path(owner).resolve()
        self.durable = durable
        self.model_uid = model_uid
        self.reattached = False
        self.attach_problem: str | None = None
        # Why the file at ``path`` is no longer this tier's (removed, replaced), once the
        # core noticed: new pauses go elsewhere until :meth:`reopen` makes a new file.
        self.gone: str | None = None
        self._offsets: list[int] = []
        offset = HEADER_BYTES
        for spec in geometry.arrays:
            self._offsets.append(offset)
            offset = _align(offset + self.capacity_blocks * spec.block_nbytes)
        self.file_bytes = offset
        self._populate = populate
        self._map_file(self._open())

    def _map_file(self, fd: int) -> None:
        self._fd = fd
        st = os.fstat(fd)
        self.identity = (st.st_dev, st.st_ino)  # what a replaced file no longer has
        flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if self._populate else 0)
        self._map = mmap.mmap(fd, self.file_bytes, flags=flags)
        self._buffers = [
            np.frombuffer(
                self._map,
                dtype=spec.dtype,
                count=self.capacity_blocks * int(np.prod(spec.block_shape)),
                offset=off,
            ).reshape(self.capacity_blocks, *spec.block_shape)
            for spec, off in zip(self.geometry.arrays, self._offsets, strict=True)
        ]

    # ---- orphans and a file gone while running ---------------------------------------

    def holds_data(self) -> bool:
        """Whether any slot holds a byte that is not zero (a new file is all zeros)."""
        body = np.frombuffer(
            self._map, dtype=np.uint8, count=self.file_bytes - HEADER_BYTES, offset=HEADER_BYTES
        )
        return bool(body.any())

    def discard(self) -> Path:
        """Move the file aside (never deleted) and start on a new, empty one; returns
        where the old one went. Only before any slot is in use (start-up)."""
        self._unmap()
        aside = self.path.with_name(f"{self.path.name}.discarded-{time.time_ns()}")
        self.path.rename(aside)
        self.reattached = False
        self._map_file(self._create())
        return aside

    def allocate(self, owner: Hashable, n: int) -> list[int]:
        if self.gone is not None and n:
            raise TierFullError(
                f"{self.name} tier is unavailable: {self.gone}",
                tier=self.name,
                needed_blocks=n,
                free_blocks=0,
                capacity_blocks=self.capacity_blocks,
            )
        return super().allocate(owner, n)

    def reopen(self) -> None:
        """Map a file at ``path`` again (a new one, or one that passes the checks of a
        start) once no slot is in use: the tier is usable and persistent again."""
        if self.used_blocks:
            raise ValueError(f"{self.name} tier: {self.used_blocks} slots still in use")
        if not self.path.parent.is_dir():
            # Its whole folder was removed: someone cleaned up on purpose; never make it
            # again behind their back (the tier stays unavailable until a restart).
            raise ConfigError(f"{self.name} tier: the folder {self.path.parent} is gone")
        self._unmap()
        self.reattached, self.attach_problem = False, None
        self._map_file(self._open())
        self.gone = None

    def missing(self) -> str | None:
        """Why the file at ``path`` is no longer the one this tier maps, or None.

        Removed (nothing at the path, or no link left) or replaced (another inode at the
        path): the mapped bytes may still be readable, but nothing a restart would find
        holds them, and a replaced file is someone else's.
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return f"{self.path} was removed"
        except OSError as exc:
            return f"{self.path} cannot be examined: {exc.strerror}"
        if (st.st_dev, st.st_ino) != self.identity:
            return f"{self.path} was replaced by another file"
        if os.fstat(self._fd).st_nlink == 0:
            return f"{self.path} was removed"
        return None

    # ---- header -----------------------------------------------------------------------

    def expected_header(self) -> dict[str, Any]:
        return {
            "tier": self.name,
            "model_uid": self.model_uid,
            "block_size": self.geometry.block_size,
            "arrays": [
                {"block_shape": list(a.block_shape), "dtype": a.dtype} for a in self.geometry.arrays
            ],
            "capacity_blocks": self.capacity_blocks,
        }

    def _mismatch(self) -> str | None:
        """Why the existing file cannot be re-attached, or None if it can."""
        st = self.path.stat()
        if st.st_uid != os.geteuid():
            return f"owned by uid {st.st_uid}, not this daemon's uid {os.geteuid()}"
        if st.st_mode & 0o077:
            return f"mode {st.st_mode & 0o777:o} is not 0600"
        try:
            header = read_header(self.path)
        except (ValueError, OSError) as exc:
            return f"unreadable header: {exc}"
        if st.st_size != self.file_bytes:
            return f"file is {st.st_size} bytes, this geometry needs {self.file_bytes}"
        expected = self.expected_header()
        for key in ("tier", "model_uid", "block_size", "arrays", "capacity_blocks"):
            if header.get(key) != expected[key]:
                return f"{key} is {header.get(key)!r}, this daemon has {expected[key]!r}"
        return None

    def _lock(self, fd: int) -> None:
        """Hold an exclusive flock on the file for as long as it is open (mmap included).

        A second daemon pointed at the same file stops with ConfigError instead of
        sharing (or moving aside) slots the first one is using. The kernel drops the lock
        when the holder dies, so a crashed daemon's file is re-attached as before.
        """
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            os.close(fd)
            raise ConfigError(
                f"tiers.{self.name}: {self.path} is in use by another agentpark daemon (the "
                f"file is locked); give each daemon its own state_dir or tiers.{self.name}.path",
                path=str(self.path),
            ) from None

    def _open(self) -> int:
        if not self.path.exists():
            return self._create()
        fd: int | None = None
        if self.path.stat().st_uid == os.geteuid():  # never lock (or wait on) a stranger's file
            try:
                fd = os.open(self.path, os.O_RDWR)
            except PermissionError:
                fd = None
            if fd is not None:
                self._lock(fd)  # closes fd and raises if another daemon holds it
        problem = self._mismatch()
        if problem is None and fd is None:
            problem = "cannot be opened read-write"
        if problem is None:
            assert fd is not None
            self.reattached = True
            log.info("%s tier: re-attached %s", self.name, self.path)
            return fd
        aside = self.path.with_name(f"{self.path.name}.mismatch-{time.time_ns()}")
        self.path.rename(aside)
        if fd is not None:
            os.close(fd)
        self.attach_problem = f"{self.path}: {problem}"
        log.error(
            "%s tier: refusing to attach %s: %s; moved it to %s and starting empty",
            self.name,
            self.path,
            problem,
            aside,
        )
        return self._create()

    def _create(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self._lock(fd)  # another daemon opened it in the instant since: it is theirs now
        try:
            if os.fstat(fd).st_mode & 0o077:  # O_CREAT's mode is masked, never widened; still
                os.fchmod(fd, 0o600)
            extra: dict[str, Any] = {"created_at": time.time()}
            if self.owner is not None:
                extra["state_dir"] = str(self.owner)
            body = json.dumps({**self.expected_header(), **extra}).encode()
            if _PREFIX.size + len(body) > HEADER_BYTES:
                raise ConfigError(f"{self.name} tier header does not fit in {HEADER_BYTES} bytes")
            os.pwrite(fd, _PREFIX.pack(MAGIC, FORMAT_VERSION, len(body)) + body, 0)
            try:
                os.posix_fallocate(fd, 0, self.file_bytes)
            except OSError as exc:
                raise ConfigError(
                    f"tiers.{self.name}: cannot reserve {self.file_bytes} bytes at {self.path}: "
                    f"{exc.strerror}; lower tiers.{self.name}.capacity"
                ) from None
            if self.durable:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        log.info("%s tier: created %s (%d blocks)", self.name, self.path, self.capacity_blocks)
        return fd

    # ---- bytes ------------------------------------------------------------------------

    @property
    def region_offsets(self) -> tuple[int, ...]:
        """Byte offset of each pool array's region (another process maps the file too)."""
        return tuple(self._offsets)

    def buffers(self) -> list[np.ndarray]:
        return self._buffers

    def flush(self) -> None:
        """Make written blocks durable before a move is reported done (disk: fsync)."""
        if self.durable:
            self._map.flush()
            os.fsync(self._fd)

    def close(self) -> None:
        self._unmap()

    def _unmap(self) -> None:
        self._buffers = []
        try:
            self._map.close()
        except BufferError:
            log.debug("%s tier: a view is still alive; the map closes when it goes", self.name)
        os.close(self._fd)


def orphaned(tiers: Sequence[object]) -> list[FileTier]:
    """File tiers re-attached with data in their slots: what a database that knows no
    session cannot account for."""
    return [t for t in tiers if isinstance(t, FileTier) and t.reattached and t.holds_data()]
