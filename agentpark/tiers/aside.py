"""The one way a refused or replaced file is moved aside: ``<name>.mismatch-<ns>``.

A file agentpark will not use again (a tier file refused at start, discarded, or
replaced by ``register`` with another layout; TPU Sync segments of another layout) is
renamed, never deleted at once: someone may want to look at it. Only the newest copy of
each name is kept: moving a file aside removes an older moved-aside copy of the same
name first, so retries never fill /dev/shm with full-size copies. ``agentpark db
cleanup`` lists and removes what is left (:data:`ASIDE_MARK` in the name).
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

__all__ = ["ASIDE_MARK", "LEGACY_MARKS", "is_aside", "move_aside"]

log = logging.getLogger(__name__)

ASIDE_MARK = ".mismatch-"
LEGACY_MARKS = (".discarded-",)  # what older daemons named a discarded file


def is_aside(path: Path) -> bool:
    """Whether ``path`` names a moved-aside file (this daemon's or an older one's)."""
    return any(mark in path.name for mark in (ASIDE_MARK, *LEGACY_MARKS))


def move_aside(path: Path, why: str) -> Path:
    """Rename ``path`` to ``<name>.mismatch-<ns>`` (older copies of it removed); returns
    the new path. A symlink is renamed, never followed."""
    prefix = f"{path.name}{ASIDE_MARK}"
    try:
        olders = [p for p in path.parent.iterdir() if p.name.startswith(prefix)]
    except OSError:
        olders = []
    for older in olders:
        with contextlib.suppress(OSError):  # another user's file in a shared folder: left
            older.unlink()
            log.info("removed %s: a newer copy of %s is moved aside", older, path.name)
    aside = path.with_name(f"{path.name}{ASIDE_MARK}{time.time_ns()}")
    path.rename(aside)
    log.warning("moved %s aside to %s: %s", path, aside, why)
    return aside
