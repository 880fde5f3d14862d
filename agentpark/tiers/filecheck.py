"""Is a mapped tier file still safe to touch? Checks made by descriptor and by name.

A file mapped with ``MAP_SHARED`` that shrinks makes every access past its new end fault
(SIGBUS kills the daemon); one replaced at its path is no longer what a restart finds; one
whose owner or mode changed is no longer only ours. These checks cost two system calls
and run before each use of the mapping and on each policy tick.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["not_private", "unsafe"]


def not_private(st: os.stat_result) -> str | None:
    """Why a file with this ``fstat`` is not one this daemon may map, or None."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not this daemon's uid {os.geteuid()}"
    if st.st_mode & 0o077:
        return f"mode {st.st_mode & 0o777:o} is not 0600"
    return None


def unsafe(path: Path, fd: int, size: int, identity: tuple[int, int, int, int]) -> str | None:
    """Why the file open as ``fd`` (mapped for ``size`` bytes, with ``identity`` = device,
    inode, owner, mode when it was opened) may not be used any more, or None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path} was removed"
    except OSError as exc:
        return f"{path} cannot be examined: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} was replaced by a symlink"
    if (st.st_dev, st.st_ino) != identity[:2]:
        return f"{path} was replaced by another file"
    fst = os.fstat(fd)
    if fst.st_nlink == 0:
        return f"{path} was removed"
    if fst.st_size < size:
        return f"{path} shrank to {fst.st_size} bytes (mapped {size})"
    now = (fst.st_uid, stat.S_IMODE(fst.st_mode))
    if now != identity[2:]:
        return f"{path} changed owner or mode to uid {now[0]}, mode {now[1]:o}"
    return None
