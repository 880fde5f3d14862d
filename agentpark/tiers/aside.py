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
import secrets
import time
from pathlib import Path

__all__ = ["ASIDE_MARK", "LEGACY_MARKS", "STAGING_MARK", "is_aside", "move_aside", "staging"]

log = logging.getLogger(__name__)

ASIDE_MARK = ".mismatch-"
LEGACY_MARKS = (".discarded-",)  # what older daemons named a discarded file
STAGING_MARK = ".new-"  # a file made under this name is renamed into place once verified


def is_aside(path: Path) -> bool:
    """Whether ``path`` names a file no daemon will use again: moved aside (by this
    daemon or an older one), or a new file a crash left under its staging name."""
    if path.name.startswith(".") and STAGING_MARK in path.name:
        return True
    return any(mark in path.name for mark in (ASIDE_MARK, *LEGACY_MARKS))


def staging(path: Path) -> Path:
    """A name beside ``path`` nobody can predict, for a file made before it is used."""
    return path.with_name(f".{path.name}{STAGING_MARK}{secrets.token_hex(8)}")


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
