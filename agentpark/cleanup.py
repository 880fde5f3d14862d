"""``agentpark db cleanup``: find tier files no daemon will use again, and remove them.

Each daemon keeps an shm tier file (default ``/dev/shm/agentpark-<host>-<hash>``, hundreds
of MiB of RAM) and maybe a disk tier file; a file refused at start, discarded or replaced
by a new layout is moved aside as ``<name>.mismatch-<ns>`` (one per name, ``tiers.aside``),
and a crash while ``register`` made a new pool file may leave it under its staging name
(``.<name>.new-<hex>``). Nothing else ever removes them. A tier file is found by its
header's magic (``AGPKTIER``) in: the entries of the shm folder named ``agentpark-*`` (and one
level inside such folders, where tests and benches put theirs), the configured state dir,
and the folders of configured tier paths. Each is put in one class:

- ``in use``: a live daemon holds its ``flock`` (it has the file open). Never removed.
- ``moved aside``: a ``.mismatch-`` copy (or an older ``.discarded-`` one, or a staging
  file left by a crash); no daemon re-attaches one. Removed.
- ``orphaned``: the header names the owning state dir and that folder is gone. Removed.
- ``owner running``: the owning state dir is locked by a live daemon that does not have
  this file open (its config changed, or it is starting). Kept.
- ``stopped``: the owning state dir exists (or the file predates the owner field in the
  header) and no daemon runs on it: the file holds parked sessions its next start
  re-attaches. Removed only with ``--include-stopped`` (those sessions are then recomputed
  from their token logs).

Each line names what the file is (the vLLM pool of a model, or a tier) and its owner, the
state dir its header names: a daemon records itself there when it makes a file and when
it re-attaches an older daemon's file that named no one.

A file is removed while this process holds its ``flock``, so a daemon starting at that
moment is refused the file instead of attaching a file that is going away.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentpark.statedir import LOCK_NAME
from agentpark.tiers.aside import is_aside
from agentpark.tiers.header import MAGIC, read_header

__all__ = ["TierFile", "find_tier_files", "remove", "run_cleanup"]

SHM_ROOT = Path("/dev/shm")
PREFIX = "agentpark-"

IN_USE = "in use"
MOVED = "moved aside"
ORPHANED = "orphaned"
OWNER_RUNNING = "owner running"
STOPPED = "stopped"
REMOVABLE = frozenset({MOVED, ORPHANED})


@dataclass(frozen=True)
class TierFile:
    path: Path
    size: int
    kind: str
    why: str


def _is_tier_file(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _held(path: Path) -> bool | None:
    """Whether another open file holds the flock (None: cannot tell, e.g. not ours)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return True
        return None
    finally:
        os.close(fd)  # drops the lock if this took it
    return False


def _candidates(roots: Iterable[Path], shm_root: Path) -> Iterator[Path]:
    seen: set[Path] = set()

    def files(folder: Path) -> Iterator[Path]:
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            return
        for entry in entries:
            if entry.is_file() and not entry.is_symlink():
                yield entry

    found: list[Path] = []
    try:
        shm_entries = sorted(p for p in shm_root.iterdir() if p.name.startswith(PREFIX))
    except OSError:
        shm_entries = []
    for entry in shm_entries:
        if entry.is_symlink():
            continue
        if entry.is_dir():
            found.extend(files(entry))
        elif entry.is_file():
            found.append(entry)
    for root in roots:
        found.extend(files(root))
    for path in found:
        key = path.resolve()
        if key not in seen and _is_tier_file(path):
            seen.add(key)
            yield path


def _state_dir_running(state_dir: Path) -> bool:
    lock = state_dir / LOCK_NAME
    return lock.exists() and _held(lock) is True


def _what(header: dict[str, Any]) -> str:
    """What the file holds, from its header: a vLLM pool (its model) or a tier's slots."""
    model = str(header.get("model_uid", ""))
    if model.startswith("vllm:"):
        return f"the vLLM pool of {model.split(':')[1] or model}"
    return f"a {header.get('tier', '?')} tier of {model or '?'}"


def classify(path: Path) -> TierFile:
    size = path.stat().st_size
    try:
        header: dict[str, Any] | None = read_header(path)
    except (ValueError, OSError) as exc:
        header, unreadable = None, f"unreadable header ({exc}); owner unknown"
    owner = None if header is None else header.get("state_dir")
    what = "" if header is None else f"{_what(header)}, "
    held = _held(path)
    if held is None:
        return TierFile(path, size, IN_USE, "cannot open it to check its lock; left alone")
    if held:
        whose = f"its owner, the daemon of {owner}," if owner else "a live daemon"
        return TierFile(path, size, IN_USE, f"{what}{whose} holds its lock")
    if is_aside(path):
        return TierFile(path, size, MOVED, "moved aside (refused, discarded or replaced)")
    if header is None:
        return TierFile(path, size, STOPPED, unreadable)
    if not owner:
        return TierFile(path, size, STOPPED, "no owner in its header (an older daemon's)")
    state_dir = Path(owner)
    if not state_dir.is_dir():
        return TierFile(path, size, ORPHANED, f"{what}state dir {state_dir} is gone")
    if _state_dir_running(state_dir):
        why = f"{what}the daemon of {state_dir} runs without it"
        return TierFile(path, size, OWNER_RUNNING, why)
    why = f"{what}no daemon runs on {state_dir}; a start re-attaches it"
    return TierFile(path, size, STOPPED, why)


def find_tier_files(roots: Iterable[Path] = (), shm_root: Path = SHM_ROOT) -> list[TierFile]:
    """Every tier file found (module docstring), classified."""
    out: list[TierFile] = []
    for path in _candidates(roots, shm_root):
        try:
            out.append(classify(path))
        except FileNotFoundError:  # removed while looking
            continue
    return out


def remove(found: TierFile) -> bool:
    """Unlink ``found`` holding its flock; False when a daemon took it meanwhile."""
    try:
        fd = os.open(found.path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        found.path.unlink()
        return True
    finally:
        os.close(fd)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover - the loop returns


def run_cleanup(
    roots: Iterable[Path],
    *,
    shm_root: Path = SHM_ROOT,
    dry_run: bool,
    yes: bool,
    include_stopped: bool,
    out: Callable[[str], None] = print,
    ask: Callable[[str], str] | None = None,
) -> int:
    """List, then remove on confirmation; exit status 0, or 1 when something failed."""
    found = find_tier_files(roots, shm_root)
    removable = REMOVABLE | ({STOPPED} if include_stopped else set())
    doomed = [f for f in found if f.kind in removable]
    if not found:
        out("no tier files found")
        return 0
    for f in found:
        mark = "remove" if f in doomed else "keep"
        out(f"{mark:6} {_size(f.size):>10}  {f.kind:13}  {f.path}  ({f.why})")
    total = sum(f.size for f in doomed)
    out(f"{len(doomed)} of {len(found)} files to remove, {_size(total)} in all")
    if not include_stopped and any(f.kind == STOPPED for f in found):
        out("stopped daemons' files are kept; --include-stopped removes them too")
    if dry_run or not doomed:
        return 0
    if not yes:
        if ask is None and not sys.stdin.isatty():
            out("not removing anything: no terminal to confirm on; pass --yes")
            return 1
        answer = (ask or input)(f"remove {len(doomed)} files ({_size(total)})? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            out("nothing removed")
            return 0
    failed = 0
    freed = 0
    for f in doomed:
        if remove(f):
            freed += f.size
        else:
            failed += 1
            out(f"not removed (a daemon took it, or it is gone): {f.path}")
    out(f"removed {len(doomed) - failed} files, {_size(freed)} freed")
    return 1 if failed else 0
