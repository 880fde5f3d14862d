"""A tier in one preallocated file, mapped into memory: the shared half of shm and disk.

Layout: a header (:mod:`agentpark.tiers.header`: 4 KiB, more for a layout of many arrays),
then one region per pool array (4 KiB aligned) of ``capacity_blocks`` rows in the pool's
own layout. The header names the model uid, the block geometry, the dtypes and the
capacity (and, when the daemon gave it, the state dir that owns the file: ``agentpark db
cleanup`` reads it). Which slots belong to which session is not in the file: it lives in
SQLite (``sessions.parked_handle``), written in the same transaction that reports the
pause done.

Opened with ``O_NOFOLLOW`` and judged by ``fstat``, a file is re-attached only if it is a
regular file of ours (mode 0600) whose header matches this daemon exactly; anything else
(a symlink, a stranger's file, another layout) is moved aside (``tiers.aside``), the
reason kept in ``attach_problem``, and the tier starts empty (its sessions become LOST).

A mapped file that shrinks faults (SIGBUS) on the next access past its end, so the file is
checked before every use (:meth:`FileTier.buffers`) and on each policy tick
(:meth:`FileTier.missing`): removed, shrunk, replaced or changed (owner, mode) and the old
mapping is never touched again; the core then loses its sessions and remakes the file.

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
import logging
import mmap
import os
import stat
import time
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentpark.blocks import PoolGeometry
from agentpark.errors import ConfigError, TierFullError, TransferError
from agentpark.tiers.aside import move_aside
from agentpark.tiers.base import SlotTier
from agentpark.tiers.filecheck import not_private, unsafe
from agentpark.tiers.header import (
    FORMAT_VERSION,
    HEADER_BYTES,
    MAGIC,
    align,
    encode_header,
    header_bytes,
    read_header,
    read_header_fd,
    record_owner,
)
from agentpark.tiers.slots import Reservation

__all__ = ["FORMAT_VERSION", "HEADER_BYTES", "MAGIC", "FileTier", "orphaned", "read_header"]

log = logging.getLogger(__name__)

_OPEN = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC


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
        fresh: bool = False,
        sparse: bool = False,
    ) -> None:
        """``fresh``: only make a new file at ``path`` (FileExistsError if anything is
        there); never re-attach or move aside (``register`` builds its new pool so).
        ``sparse``: made and mapped without touching its pages (:meth:`_reserve`)."""
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
        # Why the file at ``path`` is no longer this tier's (removed, shrunk, replaced),
        # once noticed: new pauses go elsewhere until :meth:`reopen` makes a new file.
        self.gone: str | None = None
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._buffers: list[np.ndarray] = []
        self.header_bytes = header_bytes(self._fields())
        self._offsets: list[int] = []
        offset = self.header_bytes
        for spec in geometry.arrays:
            self._offsets.append(offset)
            offset = align(offset + self.capacity_blocks * spec.block_nbytes)
        self.file_bytes = offset
        self._populate = populate and not sparse
        self._sparse = sparse
        self._map_file(self._create() if fresh else self._open())

    def _fields(self) -> dict[str, Any]:
        fields = self.expected_header()
        if self.owner is not None:
            fields["state_dir"] = str(self.owner)
        return fields

    def _map_file(self, fd: int) -> None:
        self._fd = fd
        st = os.fstat(fd)
        # What a replaced or changed file no longer has.
        self.identity = (st.st_dev, st.st_ino, st.st_uid, stat.S_IMODE(st.st_mode))
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
        if self.notice() is not None or self._map is None:
            return False
        body = np.frombuffer(
            self._map,
            dtype=np.uint8,
            count=self.file_bytes - self.header_bytes,
            offset=self.header_bytes,
        )
        return bool(body.any())

    def discard(self) -> Path:
        """Move the file aside (never deleted) and start on a new, empty one; returns
        where the old one went. Only before any slot is in use (start-up)."""
        self._unmap()
        aside = move_aside(self.path, f"{self.name} tier discarded")
        self.reattached = False
        self._map_file(self._create())
        return aside

    def reserve(self, owner: Hashable, keys: Sequence[Hashable | None]) -> Reservation:
        n = len(keys)
        if n and self.notice() is not None:
            raise TierFullError(
                f"{self.name} tier is unavailable: {self.gone}",
                tier=self.name,
                needed_blocks=n,
                free_blocks=0,
                capacity_blocks=self.capacity_blocks,
            )
        return super().reserve(owner, keys)

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
        """Why the file is no longer safe to use through this mapping, or None.

        Removed (nothing at the path, or no link left), shrunk (an access past its new
        end would fault), replaced (a symlink or another inode at the path) or changed
        (owner, mode): nothing a restart would find holds the mapped bytes, or they are
        no longer only ours.
        """
        if self._fd < 0:
            return f"{self.path} is closed"
        return unsafe(self.path, self._fd, self.file_bytes, self.identity)

    def notice(self) -> str | None:
        """:meth:`missing`, kept in ``gone`` and logged once."""
        if self.gone is None:
            why = self.missing()
            if why is not None:
                self.gone = why
                log.error(
                    "%s tier: %s; the old mapping is not used again, its sessions are "
                    "lost and the file is made again",
                    self.name,
                    why,
                )
        return self.gone

    # ---- header -----------------------------------------------------------------------

    def header(self) -> dict[str, Any]:
        """The header of the mapped file, read through its descriptor (not its path)."""
        if self._fd < 0:
            raise ValueError(f"{self.name} tier is closed")
        return read_header_fd(self._fd)

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

    def _mismatch(self, fd: int, st: os.stat_result) -> str | None:
        """Why the opened file cannot be re-attached, or None if it can."""
        try:
            header = read_header_fd(fd)
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
        """The file at ``path`` if it is ours and matches, else a new one (the old aside)."""
        problem: str | None
        try:
            fd = os.open(self.path, _OPEN)
        except FileNotFoundError:
            return self._create()
        except OSError as exc:  # ELOOP: a symlink; EACCES: a stranger's file
            problem = f"cannot be opened read-write ({exc.strerror})"
        else:
            st = os.fstat(fd)
            problem = not_private(st)
            if problem is None:  # never lock (or wait on) a stranger's file
                self._lock(fd)  # closes fd and raises if another daemon holds it
                problem = self._mismatch(fd, st)
            if problem is None:
                self.reattached = True
                if self.owner is not None and record_owner(fd, self._fields(), self.header_bytes):
                    log.info("%s tier: %s now names its owner %s", self.name, self.path, self.owner)
                log.info("%s tier: re-attached %s", self.name, self.path)
                return fd
            os.close(fd)
        self.attach_problem = f"{self.path}: {problem}"
        try:
            aside = move_aside(self.path, problem)
        except OSError as exc:
            raise ConfigError(
                f"tiers.{self.name}: {self.path} is not this daemon's ({problem}) and cannot "
                f"be moved aside ({exc.strerror}); remove it or configure another path",
                path=str(self.path),
            ) from None
        log.error(
            "%s tier: refusing to attach %s: %s; moved it to %s and starting empty",
            self.name,
            self.path,
            problem,
            aside,
        )
        return self._create()

    def _create(self) -> int:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, _OPEN | os.O_CREAT | os.O_EXCL, 0o600)
        self._lock(fd)  # another daemon opened it in the instant since: it is theirs now
        try:
            if os.fstat(fd).st_mode & 0o077:  # O_CREAT's mode is masked, never widened; still
                os.fchmod(fd, 0o600)
            fields = {**self._fields(), "created_at": time.time()}
            try:
                raw = encode_header(fields, self.header_bytes)
            except ValueError as exc:
                raise ConfigError(f"{self.name} tier: {exc}") from None
            os.pwrite(fd, raw, 0)
            self._reserve(fd)
            if os.fstat(fd).st_size != self.file_bytes:  # verified before anyone maps it
                raise ConfigError(f"tiers.{self.name}: {self.path} did not grow to its size")
            if self.durable:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        log.info("%s tier: created %s (%d blocks)", self.name, self.path, self.capacity_blocks)
        return fd

    def _reserve(self, fd: int) -> None:
        """Every byte reserved (``posix_fallocate``), or for a ``sparse`` file its length
        only (``ftruncate``), after checking the filesystem has room for all of it. On tmpfs
        ``posix_fallocate`` allocates every page: 8 GiB took 14.6 s and 8 GiB of RAM at
        once (issue 21); sparse, pages are taken as slots are first written."""
        what = f"tiers.{self.name}: cannot reserve {self.file_bytes} bytes at {self.path}"
        if self._sparse:
            room = os.statvfs(self.path.parent)
            free = room.f_bavail * room.f_frsize
            if free < self.file_bytes:
                raise ConfigError(
                    f"{what}: its filesystem has {free} bytes free; lower the capacity"
                )
            os.ftruncate(fd, self.file_bytes)
            return
        try:
            os.posix_fallocate(fd, 0, self.file_bytes)
        except OSError as exc:
            raise ConfigError(f"{what}: {exc.strerror}; lower tiers.{self.name}.capacity") from None

    def rename(self, path: Path) -> None:
        """Give the open file the name ``path`` (same folder; what is there is replaced)."""
        os.rename(self.path, path)
        self.path = path

    # ---- bytes ------------------------------------------------------------------------

    @property
    def region_offsets(self) -> tuple[int, ...]:
        """Byte offset of each pool array's region (another process maps the file too)."""
        return tuple(self._offsets)

    def buffers(self) -> list[np.ndarray]:
        """The mapped arrays, after checking the file is still whole and ours: a shrunk
        file's mapping would fault (SIGBUS) past its new end."""
        why = self.notice()
        if why is not None:
            raise TransferError(f"{self.name} tier is unavailable: {why}", tier=self.name)
        return self._buffers

    def flush(self) -> None:
        """Make written blocks durable before a move is reported done (disk: fsync)."""
        if self.durable and self._map is not None and self._fd >= 0:
            self._map.flush()
            os.fsync(self._fd)

    def close(self) -> None:
        """Unmap and close; a second call does nothing."""
        self._unmap()

    def _unmap(self) -> None:
        self._buffers = []
        region, self._map = self._map, None
        if region is not None:
            try:
                region.close()
            except BufferError:
                log.debug("%s tier: a view is still alive; the map closes when it goes", self.name)
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def orphaned(tiers: Sequence[object]) -> list[FileTier]:
    """File tiers re-attached with data in their slots: what a database that knows no
    session cannot account for."""
    return [t for t in tiers if isinstance(t, FileTier) and t.reattached and t.holds_data()]
