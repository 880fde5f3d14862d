"""The state dir: one daemon at a time (``daemon.lock``), private modes (0700 / 0600).

A daemon holds an exclusive ``flock`` on ``<state_dir>/daemon.lock`` from the first thing
it does until it has shut down; the file holds the holder's pid, so a second daemon on the
same state dir is refused with a message naming it. The kernel drops the lock when the
process dies (``kill -9`` included), so a stale file never blocks a restart.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from pathlib import Path

from agentpark.errors import ConfigError

__all__ = ["LOCK_NAME", "StateLock", "private_dir", "private_file", "write_private"]

log = logging.getLogger(__name__)

LOCK_NAME = "daemon.lock"


def private_dir(path: Path) -> None:
    """Create ``path`` (and parents) if needed and make it 0700 when this uid owns it."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid == os.geteuid() and st.st_mode & 0o077:
        log.warning("state dir %s was mode %o; setting 0700", path, st.st_mode & 0o777)
        os.chmod(path, 0o700)


def private_file(path: Path, *, create: bool = True) -> None:
    """Create ``path`` empty if missing (0600, whatever the umask), else tighten it to 0600.

    ``create=False``: only tighten a file that exists; a missing one is left missing.
    An existing file is never opened: closing any descriptor of a file drops every POSIX
    lock this process holds on it, and SQLite's locks on a live database are exactly
    that (its next write then fails with "disk I/O error").
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if not create:
            return
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # made in the instant since: tighten it as any other
            st = os.stat(path)
        else:
            try:
                if os.fstat(fd).st_mode & 0o077:  # O_CREAT's mode is masked, never widened
                    os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
            return
    if st.st_uid == os.geteuid() and st.st_mode & 0o077:
        os.chmod(path, 0o600)


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
    except OSError:
        return "unknown"
    return text or "unknown"


class StateLock:
    """The exclusive lock on a state dir; :meth:`release` is idempotent."""

    def __init__(self, state_dir: Path, fd: int) -> None:
        self.state_dir = state_dir
        self.path = state_dir / LOCK_NAME
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, state_dir: Path) -> StateLock:
        """Lock ``state_dir`` (made 0700) or raise ConfigError naming the holder's pid."""
        private_dir(state_dir)
        path = state_dir / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                holder = _read_pid(fd)
                raise ConfigError(
                    f"state dir {state_dir} is in use by another agentpark daemon "
                    f"(pid {holder}, lock {path}); stop it or give this one its own state_dir",
                    state_dir=str(state_dir),
                    pid=holder,
                ) from None
            if os.fstat(fd).st_mode & 0o077:
                os.fchmod(fd, 0o600)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(state_dir, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Empty the pid and drop the lock (the file stays: unlinking it would race)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        finally:
            os.close(fd)  # closing the last descriptor drops the flock


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (a 0600 file, fsync'ed, renamed over)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
