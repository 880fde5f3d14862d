"""``agentpark bench transfer``: pause/restore GB/s through the real control plane.

For each size, one session holding that much KV is paused to the DRAM tier and resumed
through :meth:`agentpark.parking.Parking.pause` / :meth:`~agentpark.parking.Parking.resume`
(SQLite row and event writes included), ``repeats`` times. Each repeat is interleaved with a
plain ``np.copyto`` between two preallocated, pre-faulted buffers of the same size, so
machine noise hits the reference and the measurement alike; the table reports medians,
min-max spreads and the ratio of each direction to the reference (DESIGN.md section 10).

Sessions get their KV synthetically (no model step is compiled for a huge context): seeded
random pages are written into the pool by the DMA core itself, from a scratch DRAM tier, and
the session is then handed those blocks (see :meth:`Parking.adopt_kv`). Once per size, before and
after the timed repeats, the pool rows after a resume are compared with the parked bytes;
any difference makes the bench exit 1.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentpark.dma.host_copy import HostCopyTransfer
from agentpark.engine.base import EngineAdapter
from agentpark.engine.reference import ModelSpec, PoolSpec, ReferenceEngine
from agentpark.parking import Parking, ParkingOptions, State
from agentpark.store.db import open_database
from agentpark.store.migrate import upgrade
from agentpark.store.repository import SessionStore
from agentpark.tiers.dram import DramTier

__all__ = ["SizeResult", "first_mismatch", "run_transfer_bench"]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TARGET_RATIO = 0.7
"""Pause and restore should reach this fraction of np.copyto at TARGET_FROM bytes and up."""
TARGET_FROM = 256 * MiB

# A KV geometry of a mid-sized model: 4 layers x K,V x 8 KV heads x 128 dims x 2 bytes
# = 16 KiB per token; a block is up to 64 tokens (1 MiB). The rest of the model is tiny:
# nothing is ever computed with it, but building the engine initialises its weights.
_MODEL = ModelSpec(d_model=64, n_layers=4, n_heads=8, n_kv_heads=8, head_dim=128, ffn_dim=64)
TOKEN_BYTES = _MODEL.n_layers * 2 * _MODEL.n_kv_heads * _MODEL.head_dim * 2
MAX_BLOCK_TOKENS = 64
TENANT = "bench"
SEED = 20240611


@dataclass
class SizeResult:
    """What one size measured; times in seconds, one entry per repeat."""

    size: int
    pause_s: list[float] = field(default_factory=list)
    restore_s: list[float] = field(default_factory=list)
    copy_before_pause_s: list[float] = field(default_factory=list)
    copy_before_restore_s: list[float] = field(default_factory=list)
    mismatch: str | None = None  # why the restored bytes differ; None when bit-exact

    @property
    def exact(self) -> bool:
        return self.mismatch is None

    def _gbps(self, seconds: Sequence[float]) -> list[float]:
        return [self.size / s / 1e9 for s in seconds]

    @property
    def pause_gbps(self) -> list[float]:
        return self._gbps(self.pause_s)

    @property
    def restore_gbps(self) -> list[float]:
        return self._gbps(self.restore_s)

    @property
    def copy_before_pause_gbps(self) -> list[float]:
        return self._gbps(self.copy_before_pause_s)

    @property
    def copy_before_restore_gbps(self) -> list[float]:
        return self._gbps(self.copy_before_restore_s)

    @property
    def pause_ratios(self) -> list[float]:
        """Per repeat: pause GB/s over the np.copyto run just before it."""
        return [p / c for p, c in zip(self.pause_gbps, self.copy_before_pause_gbps, strict=True)]

    @property
    def restore_ratios(self) -> list[float]:
        """Per repeat: restore GB/s over the np.copyto run just before it."""
        pairs = zip(self.restore_gbps, self.copy_before_restore_gbps, strict=True)
        return [r / c for r, c in pairs]


@dataclass
class _Stack:
    """The real parts of one daemon, built directly (no HTTP)."""

    store: SessionStore
    engine: ReferenceEngine
    transfer: HostCopyTransfer
    dram: DramTier
    parking: Parking

    @classmethod
    def build(cls, state_dir: Path, largest: int, block_tokens: int) -> _Stack:
        url = f"sqlite:///{state_dir / 'agentpark.db'}"
        upgrade(url)
        store = SessionStore(*open_database(url))
        block_nbytes = block_tokens * TOKEN_BYTES
        largest_blocks = largest // block_nbytes
        # A margin of free blocks, so a resumed session lands on other block ids than it left.
        num_blocks = largest_blocks + max(4, largest_blocks // 8)
        model = dataclasses.replace(_MODEL, max_seq_len=num_blocks * block_tokens)
        engine = ReferenceEngine(model, PoolSpec(block_size=block_tokens, num_blocks=num_blocks))
        assert engine.geometry.block_nbytes == block_nbytes
        transfer = HostCopyTransfer()
        dram = DramTier(engine.geometry, largest)
        parking = Parking(store, engine, transfer, [dram], ParkingOptions(max_new_tokens=1))
        return cls(store, engine, transfer, dram, parking)

    def close(self) -> None:
        self.store.close()


def run_transfer_bench(
    sizes: list[int],
    repeats: int,
    *,
    console: Console | None = None,
    progress_console: Console | None = None,
) -> int:
    """Measure, print the table (to ``console``, stdout by default); 1 if a restore differs.

    The progress bar goes to ``progress_console`` (stderr by default). Returns 2 for sizes
    that cannot be measured (not a whole number of KV tokens) or ``repeats < 1``.
    """
    out = console if console is not None else _stdout_console()
    err = progress_console if progress_console is not None else Console(stderr=True)
    if repeats < 1:
        err.print(f"agentpark: --repeats must be >= 1, got {repeats}")
        return 2
    bad = [s for s in sizes if s <= 0 or s % TOKEN_BYTES]
    if not sizes or bad:
        err.print(
            f"agentpark: each size must be a positive multiple of {TOKEN_BYTES // KiB} KiB "
            f"(the KV of one token); got {', '.join(map(_human, bad)) or 'none'}"
        )
        return 2
    block_tokens = _block_tokens(sizes)
    results: list[SizeResult] = []
    with tempfile.TemporaryDirectory(prefix="agentpark-bench-") as tmp:
        stack = _Stack.build(Path(tmp), max(sizes), block_tokens)
        try:
            with Progress(
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=err,
                transient=True,
            ) as progress:
                task = progress.add_task("transfer bench", total=len(sizes) * (2 + 2 * repeats))
                for i, size in enumerate(sizes):

                    def step(what: str, size: int = size) -> None:
                        progress.update(task, advance=1, description=f"{_human(size)}: {what}")

                    results.append(_bench_size(stack, size, repeats, SEED + i, step))
                    gc.collect()
            geometry = stack.engine.geometry
            notes = [
                f"GB = 1e9 bytes; median (min-max) of {repeats} repeats; a ratio is, per repeat, "
                "the operation's GB/s over the np.copyto run just before it (same size, "
                "preallocated); pause and restore are timed around Parking.pause/resume "
                "(SQLite writes included).",
                f"pool {geometry.num_blocks} blocks x {_human(geometry.block_nbytes)} "
                f"({geometry.block_size} tokens), dram tier {_human(stack.dram.capacity_bytes)}, "
                f"dma {stack.transfer.name}, jax {jax.__version__} ({jax.default_backend()}), "
                f"numpy {np.__version__}.",
            ]
        finally:
            stack.close()
    out.print(_table(results))
    for note in notes:
        out.print(note, soft_wrap=True, highlight=False)
    failed = [r for r in results if not r.exact]
    for r in failed:
        out.print(f"[red]FAIL[/red] {_human(r.size)}: restored KV is not bit-exact: {r.mismatch}")
    out.print(_verdict(results), soft_wrap=True, highlight=False)
    return 1 if failed else 0


# ---- one size ----------------------------------------------------------------------------


def _bench_size(
    stack: _Stack, size: int, repeats: int, seed: int, step: Callable[[str], None]
) -> SizeResult:
    parking, engine = stack.parking, stack.engine
    result = SizeResult(size)
    session_id = f"kv-{size}"
    num_blocks = size // engine.geometry.block_nbytes
    num_tokens = size // TOKEN_BYTES
    rng = np.random.default_rng(seed)

    parking.create(TENANT, session_id, {"bench": "transfer", "kv_bytes": size})
    key = (TENANT, session_id)
    blocks = engine.allocator.allocate(key, num_blocks)
    expected = _fill_blocks(stack, blocks, rng)  # the bytes the session must get back
    tokens = rng.integers(0, engine.vocab_size, num_tokens).tolist()
    parking.adopt_kv(TENANT, session_id, tokens, blocks, np.zeros(engine.vocab_size, "f4"))
    result.mismatch = _check(engine, expected, blocks, "after fill")
    src, dst = _prefaulted(size), _prefaulted(size)
    try:
        if result.exact:
            # Warm-up, untimed: SQLite, caches, and the restore scatter's compiles. Restore
            # compiles one scatter per power-of-two run length, and a pause whose tier slots
            # wrap around the end of the tier restores as two runs of new lengths; cycling
            # through the whole tier once compiles every shape the timed repeats will meet.
            np.copyto(dst, src)
            for _ in range(-(-stack.dram.capacity_blocks // num_blocks) + 1):
                _round_trip(parking, session_id)
            result.mismatch = _check(engine, expected, _blocks_of(engine, key), "after warm-up")
        step("warm-up")
        for _ in range(repeats if result.exact else 0):
            result.copy_before_pause_s.append(_timed(np.copyto, dst, src))
            result.pause_s.append(_timed(_pause, parking, session_id))
            step("pause")
            result.copy_before_restore_s.append(_timed(np.copyto, src, dst))
            result.restore_s.append(_timed(_resume, parking, session_id))
            step("restore")
        if result.exact:
            result.mismatch = _check(engine, expected, _blocks_of(engine, key), "after repeats")
        step("verified")
    finally:
        parking.delete(TENANT, session_id)
        del src, dst, expected
    return result


def _round_trip(parking: Parking, session_id: str) -> None:
    _pause(parking, session_id)
    _resume(parking, session_id)


def _pause(parking: Parking, session_id: str) -> None:
    row = parking.pause(TENANT, session_id, tier="dram").row
    if row.state != State.PARKED:
        raise RuntimeError(f"pause left the session {row.state}")


def _resume(parking: Parking, session_id: str) -> None:
    result = parking.resume(TENANT, session_id)
    if result.restored_from != "dram":
        raise RuntimeError(f"resume restored from {result.restored_from}, not the dram tier")


def _timed(fn: Callable[..., object], *args: object) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def _prefaulted(size: int) -> np.ndarray:
    """A memcpy reference buffer with every page written once (like the tier buffers)."""
    buf = np.empty(size, dtype=np.uint8)
    buf.fill(1)
    return buf


def _blocks_of(engine: EngineAdapter, key: tuple[str, str]) -> list[int]:
    return engine.allocator.owned(key)


# ---- synthetic KV ------------------------------------------------------------------------


def _fill_blocks(stack: _Stack, blocks: list[int], rng: np.random.Generator) -> list[np.ndarray]:
    """Write seeded random pages into pool ``blocks`` with the DMA core (h2d from a scratch
    tier); returns the scratch tier's buffers (``[len(blocks), ...]``), i.e. what they hold."""
    engine = stack.engine
    scratch = DramTier(engine.geometry, len(blocks) * engine.geometry.block_nbytes)
    slots = scratch.allocate("fill", len(blocks))
    buffers = [buf[: len(blocks)] for buf in scratch.buffers()]
    for buf in buffers:
        flat = buf.reshape(len(blocks), -1).view(np.uint8)
        for row in flat:  # a block at a time keeps the temporaries small
            row[:] = np.frombuffer(rng.bytes(row.size), dtype=np.uint8)
    stack.transfer.h2d(scratch, slots, engine, blocks)
    return buffers


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


def _check(
    engine: EngineAdapter, expected: list[np.ndarray], blocks: list[int], when: str
) -> str | None:
    with engine.lock:
        views = [np.asarray(arr) for arr in engine.kv_pool()]  # zero-copy on CPU
        try:
            why = first_mismatch(expected, views, blocks)
        finally:
            del views  # no host view may outlive the lock: the next restore donates the pool
    return None if why is None else f"{when}: {why}"


# ---- geometry and report -----------------------------------------------------------------


def _block_tokens(sizes: Sequence[int]) -> int:
    """The largest power of two <= MAX_BLOCK_TOKENS tokens that divides every size."""
    tokens = math.gcd(*(s // TOKEN_BYTES for s in sizes))
    block = 1
    while block * 2 <= MAX_BLOCK_TOKENS and tokens % (block * 2) == 0:
        block *= 2
    return block


def _table(results: Sequence[SizeResult]) -> Table:
    table = Table(title="agentpark bench transfer: Parking.pause/resume vs np.copyto")
    table.add_column("KV/session", justify="right")
    table.add_column("pause GB/s", justify="right")
    table.add_column("restore GB/s", justify="right")
    table.add_column("copyto GB/s", justify="right")
    table.add_column("pause ratio", justify="right")
    table.add_column("restore ratio", justify="right")
    table.add_column("bit-exact", justify="center")
    for r in results:
        if not r.pause_s:
            table.add_row(_human(r.size), "-", "-", "-", "-", "-", "[red]NO[/red]")
            continue
        cells = [_human(r.size), _spread(r.pause_gbps), _spread(r.restore_gbps)]
        cells.append(_spread(r.copy_before_pause_gbps + r.copy_before_restore_gbps))
        for ratios in (r.pause_ratios, r.restore_ratios):
            ratio = statistics.median(ratios)
            style = "red" if r.size >= TARGET_FROM and ratio < TARGET_RATIO else "green"
            cells.append(f"[{style}]{ratio:.2f}[/{style}] ({min(ratios):.2f}-{max(ratios):.2f})")
        cells.append("[green]yes[/green]" if r.exact else "[red]NO[/red]")
        table.add_row(*cells)
    return table


def _spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _verdict(results: Sequence[SizeResult]) -> str:
    head = f"target: ratio >= {TARGET_RATIO} from {_human(TARGET_FROM)} up, both directions: "
    judged = [r for r in results if r.size >= TARGET_FROM and r.pause_s]
    if not judged:
        return head + "no size to judge"
    misses = [
        f"{name} at {_human(r.size)} ({statistics.median(ratios):.2f})"
        for r in judged
        for name, ratios in (("pause", r.pause_ratios), ("restore", r.restore_ratios))
        if statistics.median(ratios) < TARGET_RATIO
    ]
    return head + ("met" if not misses else "MISSED: " + ", ".join(misses))


def _human(size: int) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if size >= unit and size % unit == 0:
            return f"{size // unit} {name}"
    return f"{size} B"


def _stdout_console() -> Console:
    """stdout; not narrower than the table when stdout is a pipe or a file (80 columns)."""
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 140))
