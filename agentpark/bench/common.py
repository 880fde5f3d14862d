"""Pieces shared by the benchmarks: consoles, progress bars, formatting, filesystems, checks."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from agentpark.engine.base import EngineAdapter
from agentpark.enums import State
from agentpark.parking import PauseOrder, SessionCore

__all__ = [
    "BENCH_TENANT",
    "MEMORY_FILESYSTEMS",
    "GiB",
    "KiB",
    "LineProgress",
    "MiB",
    "filesystem_of",
    "first_mismatch",
    "human",
    "park",
    "pool_mismatch",
    "prefaulted",
    "progress_bar",
    "restore",
    "snapshot_blocks",
    "spread",
    "stdout_console",
    "timed",
]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"})
"""Filesystems whose files live in RAM: a "disk" tier there measures memory, not a disk."""


def timed(fn: Callable[..., object], *args: object, **kwargs: object) -> float:
    """Seconds one call of ``fn`` took (perf_counter)."""
    started = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - started


def prefaulted(size: int) -> np.ndarray:
    """A reference buffer with every page written once (like the tier buffers)."""
    buf = np.empty(size, dtype=np.uint8)
    buf.fill(1)
    return buf


def human(size: int) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if size >= unit and size % unit == 0:
            return f"{size // unit} {name}"
    return f"{size} B"


def spread(values: Sequence[float], fmt: str = ".2f") -> str:
    """``median (min-max)``."""
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def stdout_console(min_width: int = 140) -> Console:
    """stdout; not narrower than the table when stdout is a pipe or a file (80 columns)."""
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, min_width))


class LineProgress:
    """Progress where a live bar cannot draw (a pipe, a CI log): one line when a phase
    starts and at every tenth of it, so a long bench is never silent."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._tasks: dict[TaskID, list[Any]] = {}  # id -> [description, total, done, tenths]
        self._started = time.monotonic()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def add_task(self, description: str, total: float | None = None) -> TaskID:
        task = TaskID(len(self._tasks))
        self._tasks[task] = [description, total or 0, 0, 0]
        self._say(task)
        return task

    def advance(self, task: TaskID, advance: float = 1) -> None:
        self.update(task, advance=advance)

    def refresh(self) -> None:
        """Nothing to draw: lines are printed as the phases move on."""

    def update(self, task: TaskID, *, advance: float = 0, description: str | None = None) -> None:
        entry = self._tasks[task]
        entry[2] += advance
        if description is not None and description != entry[0]:
            entry[0] = description
            self._say(task)
            return
        tenths = int(10 * entry[2] / entry[1]) if entry[1] else 0
        if tenths > entry[3]:
            entry[3] = tenths
            self._say(task)

    def _say(self, task: TaskID) -> None:
        description, total, done, _ = self._tasks[task]
        elapsed = time.monotonic() - self._started
        self.console.print(
            f"[{elapsed:7.1f}s] {description}: {done:g}/{total:g}", highlight=False, markup=False
        )


def progress_bar(console: Console, auto_refresh: bool = True) -> Progress | LineProgress:
    """The benches' progress (on ``console``: stderr by default): a transient bar on a
    terminal, progress lines elsewhere. ``auto_refresh=False``: the bar is drawn only on
    ``refresh()``, never by rich's own thread in the middle of a timed request."""
    if not console.is_terminal:
        return LineProgress(console)
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        auto_refresh=auto_refresh,
        console=console,
        transient=True,
    )


# ---- filesystems -------------------------------------------------------------------------

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def filesystem_of(path: Path, mounts: str | None = None) -> tuple[str, str] | None:
    """``(mount point, filesystem type)`` holding ``path``, from /proc/mounts; None if unknown.

    ``mounts`` is the text of /proc/mounts (read when None). The deepest mount point that
    contains ``path`` wins, and the last line for it (a later mount hides an earlier one).
    """
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return None
    target = path.resolve()
    best: tuple[str, str] | None = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[1])
        mount = Path(point)
        if (mount == target or mount in target.parents) and (
            best is None or len(point) >= len(best[0])
        ):
            best = (point, fields[2])
    return best


# ---- verification ------------------------------------------------------------------------


def first_mismatch(
    expected: Sequence[np.ndarray], pool: Sequence[np.ndarray], block_ids: Sequence[int]
) -> str | None:
    """None when ``pool[a][block_ids[i]]`` equals ``expected[a][i]`` bit for bit for every
    array ``a`` and every ``i``; otherwise a description of the first difference."""
    if len(expected) != len(pool):
        return f"{len(expected)} expected arrays but the pool has {len(pool)}"
    for a, (want, arr) in enumerate(zip(expected, pool, strict=True)):
        if len(want) != len(block_ids):
            return f"array {a}: {len(want)} expected blocks for {len(block_ids)} block ids"
        for i, block in enumerate(block_ids):
            got = arr[block]
            if got.dtype != want[i].dtype or got.shape != want[i].shape:
                return f"array {a} block {block}: {got.dtype}{got.shape} != {want[i].dtype}"
            # Compare the raw bytes: NaN bit patterns must match too.
            diff = np.flatnonzero(got.reshape(-1).view(np.uint8) != want[i].reshape(-1).view("u1"))
            if diff.size:
                return (
                    f"array {a}, session block {i} (pool block {block}): {diff.size} bytes "
                    f"differ, first at byte {int(diff[0])}"
                )
    return None


def pool_mismatch(
    engine: EngineAdapter, expected: Sequence[np.ndarray], blocks: Sequence[int], when: str
) -> str | None:
    """:func:`first_mismatch` against the engine's live pool, prefixed with ``when``."""
    with engine.lock:
        views = [np.asarray(arr) for arr in engine.kv_pool()]  # zero-copy on CPU
        try:
            why = first_mismatch(expected, views, blocks)
        finally:
            del views  # no host view may outlive the lock: the next restore donates the pool
    return None if why is None else f"{when}: {why}"


def snapshot_blocks(engine: EngineAdapter, blocks: Sequence[int]) -> list[np.ndarray]:
    """A copy of pool rows ``blocks`` of every pool array (``[len(blocks), ...]`` each)."""
    ids = np.asarray(blocks, dtype=np.intp)
    with engine.lock:
        views = [np.asarray(arr) for arr in engine.kv_pool()]
        try:
            return [view[ids] for view in views]  # fancy indexing copies
        finally:
            del views


BENCH_TENANT = "bench"


def park(parking: SessionCore, session_id: str, tier: str) -> None:
    """Pause a bench session into ``tier`` and insist it really landed there."""
    row = parking.pause(BENCH_TENANT, session_id, PauseOrder(tier=tier, force=True)).row
    if row.state != State.PARKED or row.tier != tier:
        raise RuntimeError(f"pause left the session {row.state} in {row.tier}, not in {tier}")


def restore(parking: SessionCore, session_id: str, source: str) -> None:
    """Resume a bench session and insist it came back from ``source`` (a tier or recompute)."""
    result = parking.resume(BENCH_TENANT, session_id)
    if result.restored_from != source:
        raise RuntimeError(f"resume came from {result.restored_from}, not from {source}")
