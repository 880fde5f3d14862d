"""``agentpark bench transfer``: pause/restore GB/s through the real control plane.

For each size, one session holding that much KV is paused to one tier (``dram``, ``shm`` or
``disk``) and resumed through :meth:`agentpark.parking.SessionCore.pause` /
:meth:`~agentpark.parking.SessionCore.resume` (SQLite row and event writes included), ``repeats``
times. Each repeat is interleaved with a plain ``np.copyto`` between two preallocated,
pre-faulted buffers of the same size, so machine noise hits the reference and the measurement
alike; the table reports medians, min-max spreads and the ratio of each direction to the
reference (DESIGN.md section 10). For the disk tier each repeat also writes (``os.pwrite`` +
``os.fsync``) and reads back (``os.preadv``) a plain preallocated file of the same size on the
same filesystem, and pause and restore are judged against those.

The first table's rows run with checksums off. In the same repeats the session is paused and
resumed again with the tier checksummed (``integrity.tiers``): host_copy then hashes each
1 MiB piece as it copies it (see agentpark.integrity), and the second table says what that
adds; :func:`agentpark.integrity.checksum` over the parked copy is also timed on its own.
The third table times the copy alone (``HostCopyTransfer.d2h``/``h2d`` between the session's
blocks and spare tier slots, checksum off and on), without the SQLite bookkeeping.

``copy_threads`` (``--copy-threads``) is host_copy's ``dma.copy_threads``. With more than
one, every ratio is also printed against an ``np.copyto`` split over that many threads,
timed in the same repeat: how close the copy comes to what the memory allows, not only to
one core's memcpy.

``hash_thread`` (``--hash-thread``) is host_copy's ``dma.hash_thread`` (the checksum hashed on
a second thread, dma.host_copy.hash_thread) for every checksummed operation. The copy-alone
table also times the other checksum path in the same repeats (the hash thread without the
flag, the fused one-thread hash with it), and a fourth table puts the two side by side:
an A/B under the same machine noise.

``native_copy`` (``--no-native-copy`` turns it off) is host_copy's ``dma.native_copy``: pauses
and in-place restores through the native kernel (agentpark.dma.native: copy and xxh3 in one
pass). Where the kernel is built, the copy alone is also timed through the other copy loop
(numpy and xxhash, or the kernel) in the same repeats, and a last table puts the two side by
side.

Sessions get their KV synthetically (no model step is compiled for a huge context): seeded
random pages are written into the pool by the DMA core itself, from a scratch DRAM tier, and
the session is then handed those blocks (see :meth:`InProcessDriver.adopt_kv`). Once per
size, before and after the timed repeats, the pool rows after a resume are compared with
the parked bytes; any difference makes the bench exit 1.

``backend="tpu_sync"`` (``--backend tpu_sync``, dram tier only) runs the same sizes through
TPU Sync's KVCacheManager (the real wheel; on JAX's CPU platform it is allowed for the bench
as if ``dma.tpu_sync_on_cpu`` were set) into a slot-only tier whose bytes TPU Sync holds; its
ratios are to the same np.copyto reference. Checksum off only: agentpark cannot read TPU
Sync's host blocks, so there is no checksum-on pause/resume, no checksum table and no
checksummed copy-alone row; ``copy_threads`` (host_copy's) must be 1. The synthetic KV is
written with host_copy (CPU) or jax_memkind.

``backend="jax_memkind"`` (``--backend jax_memkind``, dram tier only) parks and restores
through :class:`~agentpark.dma.jax_memkind.JaxMemkindTransfer` (device -> pinned_host ->
tier rows, and back), and its reference is not np.copyto but :class:`PinnedPut`: one plain
``jax.device_put`` of one array of the same bytes from the device's memory to ``pinned_host``
just before each pause, and back just before each restore, blocked until ready. That is the
DMA the backend cannot beat, so the target is MEMKIND_TARGET_RATIO of it. Checksum off only
(the checksum is host-side xxh3, the same as host_copy's; the GPU check is about the copy);
``copy_threads`` must be 1. On JAX's CPU platform both memory kinds are host memory: the bench
runs, and says that its figures say nothing about a GPU. A JAX without ``pinned_host``
memory is refused with exit 2 before anything is built.

The shm and disk tier files live in a temporary directory (under /dev/shm, and under the
current directory or ``directory``) that is removed at the end, also on error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import jax
import numpy as np
from rich.console import Console
from rich.table import Table

from agentpark.bench.common import (
    BENCH_TENANT,
    MEMORY_FILESYSTEMS,
    GiB,
    KiB,
    MiB,
    filesystem_of,
    first_mismatch,
    human,
    park,
    pool_mismatch,
    prefaulted,
    progress_bar,
    restore,
    spread,
    stdout_console,
    timed,
)
from agentpark.dma import Transfer, native, select_transfer
from agentpark.dma.host_copy import MAX_COPY_THREADS, HostCopyTransfer, LastRestorePath
from agentpark.dma.jax_memkind import DEVICE, PINNED_HOST, JaxMemkindTransfer
from agentpark.dma.tpu_sync_shm import tpu_sync_version
from agentpark.engine.base import EngineAdapter
from agentpark.engine.reference import ModelSpec, PoolSpec, ReferenceEngine
from agentpark.errors import ConfigError
from agentpark.integrity import checksum
from agentpark.parking import CoreOptions, InProcessDriver, SessionCore, in_process_core
from agentpark.store.db import open_database
from agentpark.store.migrate import upgrade
from agentpark.store.repository import SessionStore
from agentpark.tiers.base import BackendHeldTier, HostTier
from agentpark.tiers.disk import DiskTier
from agentpark.tiers.dram import DramTier
from agentpark.tiers.shm import ShmTier

__all__ = [
    "BACKENDS",
    "SHM_ROOT",
    "TIERS",
    "PinnedPut",
    "PlainFile",
    "SizeResult",
    "first_mismatch",
    "run_transfer_bench",
]

TIERS = ("dram", "shm", "disk")
BACKENDS = ("host_copy", "jax_memkind", "tpu_sync")
SHM_ROOT = Path("/dev/shm")
TARGET_RATIO = 0.95
"""dram and shm: pause and restore (checksum off and on) should reach this fraction of a
single-thread np.copyto from TARGET_FROM."""
MEMKIND_TARGET_RATIO = 0.9
"""jax_memkind: pause and restore should reach this fraction of a plain pinned device_put of
the same bytes (d2h for the pause, h2d for the restore) from TARGET_FROM."""
DISK_TARGET_RATIO = 0.8
"""disk: pause and restore should reach this fraction of a plain file write / read."""
TARGET_FROM = 256 * MiB

# A KV geometry of a mid-sized model: 4 layers x K,V x 8 KV heads x 128 dims x 2 bytes
# = 16 KiB per token; a block is up to 64 tokens (1 MiB). The rest of the model is tiny:
# nothing is ever computed with it, but building the engine initialises its weights.
_MODEL = ModelSpec(d_model=64, n_layers=4, n_heads=8, n_kv_heads=8, head_dim=128, ffn_dim=64)
TOKEN_BYTES = _MODEL.n_layers * 2 * _MODEL.n_kv_heads * _MODEL.head_dim * 2
MAX_BLOCK_TOKENS = 64
TENANT = BENCH_TENANT
SEED = 20240611


@dataclass
class SizeResult:
    """What one size measured; times in seconds, one entry per repeat."""

    size: int
    tier: str = "dram"
    pause_s: list[float] = field(default_factory=list)
    restore_s: list[float] = field(default_factory=list)
    # The reference just before each pause and restore: np.copyto; for jax_memkind a plain
    # device_put device -> pinned_host (pause) and pinned_host -> device (restore).
    copy_before_pause_s: list[float] = field(default_factory=list)
    copy_before_restore_s: list[float] = field(default_factory=list)
    checksum_s: list[float] = field(default_factory=list)  # xxh3 over the parked copy
    file_write_s: list[float] = field(default_factory=list)  # disk: pwrite + fsync
    file_read_s: list[float] = field(default_factory=list)  # disk: preadv
    mismatch: str | None = None  # why the restored bytes differ; None when bit-exact
    copy_threads: int = 1
    # np.copyto over copy_threads threads, just before the checksum-off pause and restore.
    ncopy_before_pause_s: list[float] = field(default_factory=list)
    ncopy_before_restore_s: list[float] = field(default_factory=list)
    # "pause+xxh3", "restore+xxh3" (SessionCore, tier checksummed); "d2h", "h2d",
    # "d2h+xxh3", "h2d+xxh3" (the copy alone).
    ops: dict[str, Op] = field(default_factory=dict)
    backend: str = "host_copy"

    @property
    def exact(self) -> bool:
        return self.mismatch is None

    @property
    def target(self) -> float:
        """The ratio dram and shm should reach (to the reference of this backend)."""
        return MEMKIND_TARGET_RATIO if self.backend == "jax_memkind" else TARGET_RATIO

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
    def checksum_gbps(self) -> list[float]:
        return self._gbps(self.checksum_s)

    @property
    def file_write_gbps(self) -> list[float]:
        return self._gbps(self.file_write_s)

    @property
    def file_read_gbps(self) -> list[float]:
        return self._gbps(self.file_read_s)

    @property
    def pause_ratios(self) -> list[float]:
        """Per repeat: pause GB/s over the np.copyto run just before it."""
        return _ratios(self.pause_gbps, self.copy_before_pause_gbps)

    @property
    def restore_ratios(self) -> list[float]:
        """Per repeat: restore GB/s over the np.copyto run just before it."""
        return _ratios(self.restore_gbps, self.copy_before_restore_gbps)

    @property
    def pause_file_ratios(self) -> list[float]:
        """Per repeat (disk): pause GB/s over the plain file write + fsync just before it."""
        return _ratios(self.pause_gbps, self.file_write_gbps)

    @property
    def restore_file_ratios(self) -> list[float]:
        """Per repeat (disk): restore GB/s over the plain file read just before it."""
        return _ratios(self.restore_gbps, self.file_read_gbps)

    @property
    def checksum_ratios(self) -> list[float]:
        """Per repeat: xxh3 GB/s over the np.copyto run of the same repeat."""
        return _ratios(self.checksum_gbps, self.copy_before_pause_gbps)

    @property
    def pause_nratios(self) -> list[float]:
        """Per repeat: pause GB/s over the copy_threads-thread np.copyto just before it."""
        return _ratios(self.pause_gbps, self._gbps(self.ncopy_before_pause_s))

    @property
    def restore_nratios(self) -> list[float]:
        return _ratios(self.restore_gbps, self._gbps(self.ncopy_before_restore_s))

    def op(self, name: str) -> Op:
        return self.ops.setdefault(name, Op())

    @property
    def checksum_pause_cost(self) -> float:
        """What the checksum adds to a pause: median pause time, checksum on over off."""
        return statistics.median(self.op("pause+xxh3").s) / statistics.median(self.pause_s) - 1

    @property
    def checksum_restore_cost(self) -> float:
        """What verifying adds to a restore: median restore time, checksum on over off."""
        on = statistics.median(self.op("restore+xxh3").s)
        return on / statistics.median(self.restore_s) - 1

    def judged(self) -> list[tuple[str, list[float], float]]:
        """``(name, per-repeat ratios, target)`` for the targets of this tier."""
        if self.tier == "disk":
            return [
                ("pause/file write", self.pause_file_ratios, DISK_TARGET_RATIO),
                ("restore/file read", self.restore_file_ratios, DISK_TARGET_RATIO),
            ]
        judged = [
            ("pause", self.pause_ratios, self.target),
            ("restore", self.restore_ratios, self.target),
        ]
        for name in ("pause+xxh3", "restore+xxh3"):
            if name in self.ops:
                judged.append((name, self.ops[name].ratios, self.target))
        return judged


@dataclass
class Op:
    """One timed operation per repeat, each with the references timed just before it."""

    s: list[float] = field(default_factory=list)
    ref1: list[float] = field(default_factory=list)  # np.copyto, one thread (or PinnedPut)
    refn: list[float] = field(default_factory=list)  # np.copyto over copy_threads threads

    @property
    def ratios(self) -> list[float]:
        """Per repeat: GB/s over the single-thread np.copyto's (= its time over ours)."""
        return [r / t for r, t in zip(self.ref1, self.s, strict=True)]

    @property
    def nratios(self) -> list[float]:
        return [r / t for r, t in zip(self.refn, self.s, strict=True)]


def _ratios(values: Sequence[float], references: Sequence[float]) -> list[float]:
    return [v / r for v, r in zip(values, references, strict=True)]


class PlainFile:
    """The disk reference: a preallocated file written with ``os.pwrite`` + ``os.fsync`` and
    read back with ``os.preadv``, from and into pre-faulted buffers."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(self._fd, 0, size)
            os.fsync(self._fd)
        except BaseException:
            self.close()
            raise

    def write(self, buf: np.ndarray) -> None:
        view = buf.reshape(-1).view(np.uint8).data
        done = 0
        while done < self.size:
            done += os.pwrite(self._fd, view[done : self.size], done)
        os.fsync(self._fd)

    def read(self, buf: np.ndarray) -> None:
        view = buf.reshape(-1).view(np.uint8).data
        done = 0
        while done < self.size:
            n = os.preadv(self._fd, [view[done : self.size]], done)
            if n <= 0:
                raise OSError(f"{self.path}: short read at byte {done} of {self.size}")
            done += n

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.path.unlink(missing_ok=True)


class PinnedPut:
    """The jax_memkind reference: one plain ``jax.device_put`` of one array of ``size`` bytes
    between the device's memory and ``pinned_host`` memory on ``device``, blocked until ready.

    :meth:`d2h` is what a pause's DMA is, :meth:`h2d` a restore's, without the gather, the
    scatter, the chunking and the copies into and out of the tier's rows. Each call makes a
    new array and drops it, as the backend does with its chunks.
    """

    def __init__(self, size: int, device: jax.Device) -> None:
        self.size = size
        self.on_device_kind = jax.sharding.SingleDeviceSharding(device, memory_kind=DEVICE)
        self.on_host_kind = jax.sharding.SingleDeviceSharding(device, memory_kind=PINNED_HOST)
        ones = np.ones(size, dtype=np.uint8)
        self.on_device: jax.Array | None = jax.device_put(ones, self.on_device_kind)
        self.on_host: jax.Array | None = jax.device_put(self.on_device, self.on_host_kind)
        self.on_host.block_until_ready()

    def d2h(self) -> None:
        moved = jax.device_put(self.on_device, self.on_host_kind)
        moved.block_until_ready()
        moved.delete()

    def h2d(self) -> None:
        moved = jax.device_put(self.on_host, self.on_device_kind)
        moved.block_until_ready()
        moved.delete()

    def close(self) -> None:
        for array in (self.on_device, self.on_host):
            if array is not None:
                array.delete()
        self.on_device = self.on_host = None


@dataclass
class _Stack:
    """The real parts of one daemon with the one tier under test, built directly (no HTTP)."""

    store: SessionStore
    engine: ReferenceEngine
    transfer: Transfer
    tier: HostTier
    driver: InProcessDriver
    filler: Transfer  # writes the synthetic KV into the pool from a scratch dram tier
    copy_threads: int = 1  # host_copy's dma.copy_threads (1 for tpu_sync and jax_memkind)
    hash_thread: bool = False  # host_copy's dma.hash_thread
    backend: str = "host_copy"
    native_copy: bool = True  # host_copy's dma.native_copy (False where it is not built)
    # host_copy: which path the session core's timed restores took ("in place", "xla").
    restore_paths: set[str] = field(default_factory=set)

    @property
    def bytes_readable(self) -> bool:
        """False for tpu_sync: the parked bytes are TPU Sync's, agentpark cannot read them."""
        return not isinstance(self.tier, BackendHeldTier)

    @property
    def checksummed(self) -> bool:
        """Whether the checksum-on rows are measured: host_copy's only (see the module doc)."""
        return self.backend == "host_copy"

    @property
    def parking(self) -> SessionCore:
        return self.driver.core

    @classmethod
    def build(
        cls,
        state_dir: Path,
        tier_name: str,
        tier_dir: Path | None,
        largest: int,
        block_tokens: int,
        copy_threads: int = 1,
        backend: str = "host_copy",
        hash_thread: bool = False,
        native_copy: bool = True,
    ) -> _Stack:
        url = f"sqlite:///{state_dir / 'agentpark.db'}"
        upgrade(url)
        store = SessionStore(*open_database(url))
        tier: HostTier | None = None
        try:
            block_nbytes = block_tokens * TOKEN_BYTES
            largest_blocks = largest // block_nbytes
            # A margin of free blocks, so a resumed session lands on other block ids than it
            # left.
            num_blocks = largest_blocks + max(4, largest_blocks // 8)
            model = dataclasses.replace(_MODEL, max_seq_len=num_blocks * block_tokens)
            pool = PoolSpec(block_size=block_tokens, num_blocks=num_blocks)
            engine = ReferenceEngine(model, pool)
            assert engine.geometry.block_nbytes == block_nbytes
            transfer: Transfer
            filler: Transfer
            if backend == "tpu_sync":
                tier = BackendHeldTier("dram", engine.geometry, largest // block_nbytes)
                transfer = select_transfer(
                    "tpu_sync",
                    engine=engine,
                    host_blocks=tier.capacity_blocks,
                    tpu_sync_on_cpu=True,
                )
                on_cpu = jax.default_backend() == "cpu"
                filler = HostCopyTransfer() if on_cpu else JaxMemkindTransfer()
            elif backend == "jax_memkind":
                tier = DramTier(engine.geometry, largest)
                transfer = filler = select_transfer("jax_memkind")
            else:
                tier = _make_tier(tier_name, tier_dir, engine, largest)
                copier = HostCopyTransfer(
                    copy_threads=copy_threads,
                    hash_thread=hash_thread,
                    native_copy=native_copy,
                    observer=LastRestorePath(),
                )
                # Compile the restore scatter for every window size before anything is timed.
                copier.warmup(engine, tier)
                transfer = filler = copier
            # Checksums off; the repeats turn them on for the tier under test and back.
            options = CoreOptions(checksum_tiers=frozenset())
            driver = in_process_core(
                store, engine, transfer, [tier], max_new_tokens=1, options=options
            )
        except BaseException:
            if tier is not None:
                tier.close()
            store.close()
            raise
        native_on = isinstance(transfer, HostCopyTransfer) and transfer.native_copy
        return cls(
            store,
            engine,
            transfer,
            tier,
            driver,
            filler,
            copy_threads,
            hash_thread,
            backend,
            native_on,
        )

    def close(self) -> None:
        self.parking.close()
        if isinstance(self.transfer, HostCopyTransfer):
            self.transfer.close()  # its worker and hash threads
        self.tier.close()
        self.store.close()


def _make_tier(name: str, tier_dir: Path | None, engine: ReferenceEngine, size: int) -> HostTier:
    if name == "dram":
        return DramTier(engine.geometry, size)
    assert tier_dir is not None
    if name == "shm":
        return ShmTier(tier_dir / "shm-tier.bin", engine.geometry, size, engine.model_uid)
    return DiskTier(tier_dir / "disk-tier.bin", engine.geometry, size, engine.model_uid)


def run_transfer_bench(
    sizes: list[int],
    repeats: int,
    *,
    tier: str = "dram",
    directory: Path | None = None,
    console: Console | None = None,
    progress_console: Console | None = None,
    copy_threads: int = 1,
    backend: str = "host_copy",
    hash_thread: bool = False,
    native_copy: bool = True,
) -> int:
    """Measure, print the tables (to ``console``, stdout by default); 1 if a restore differs.

    ``tier`` is ``dram``, ``shm`` or ``disk``. The shm and disk tier files go in a temporary
    directory made under ``directory`` (default /dev/shm for shm, the current directory for
    disk) and removed at the end, also on error; a disk directory on a memory filesystem
    (tmpfs) is refused. The progress bar goes to ``progress_console`` (stderr by default).
    Returns 2 for arguments that cannot be measured: sizes that are not a whole number of KV
    tokens, ``repeats < 1``, an unknown tier, a directory that cannot hold the files, or
    ``copy_threads`` outside 1..64, an unknown ``backend``, or ``backend="tpu_sync"`` or
    ``"jax_memkind"`` with another tier than dram, ``copy_threads`` > 1 or ``hash_thread``, or
    ``"jax_memkind"`` on a JAX whose device lacks the ``device`` or ``pinned_host`` memory kind.
    """
    out = console if console is not None else stdout_console(200 if tier == "disk" else 150)
    err = progress_console if progress_console is not None else Console(stderr=True)
    problem = _argument_problem(sizes, repeats, tier, directory)
    if problem is None and not 1 <= copy_threads <= MAX_COPY_THREADS:
        problem = f"--copy-threads must be 1..{MAX_COPY_THREADS}, got {copy_threads}"
    if problem is None and backend not in BACKENDS:
        problem = f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}"
    if problem is None and backend != "host_copy":
        problem = _backend_problem(backend, tier, copy_threads, hash_thread)
    if problem is not None:
        err.print(f"agentpark: {problem}", soft_wrap=True, highlight=False)
        return 2
    parent = directory if directory is not None else _default_parent(tier)
    results: list[SizeResult] = []
    block_tokens = _block_tokens(sizes)
    with contextlib.ExitStack() as cleanup:
        state_dir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="agentpark-")))
        tier_dir: Path | None = None
        if parent is not None:
            tier_dir = Path(tempfile.mkdtemp(prefix="agentpark-bench-", dir=parent))
            # Registered first, so it runs last: after the tier's file is closed.
            cleanup.callback(shutil.rmtree, tier_dir, ignore_errors=True)
        stack = _Stack.build(
            state_dir,
            tier,
            tier_dir,
            max(sizes),
            block_tokens,
            copy_threads,
            backend,
            hash_thread,
            native_copy,
        )
        cleanup.callback(stack.close)
        ncopy = _threaded_copyto(copy_threads, cleanup)
        with progress_bar(err) as progress:
            # Per repeat: pause, restore, (checksum on,) copy alone.
            per_repeat = 4 if stack.checksummed else 3
            label = tier if backend == "host_copy" else f"{tier}, {backend}"
            task = progress.add_task(
                f"transfer bench ({label})", total=len(sizes) * (2 + per_repeat * repeats)
            )
            for i, size in enumerate(sizes):

                def step(what: str, size: int = size) -> None:
                    progress.update(task, advance=1, description=f"{tier} {human(size)}: {what}")

                results.append(_bench_size(stack, size, repeats, SEED + i, step, tier_dir, ncopy))
                gc.collect()
        notes = _notes(stack, tier, tier_dir, repeats)
    out.print(_table(tier, results, copy_threads, backend))
    if backend == "host_copy":  # the others: checksum off only (see the module doc)
        out.print(_checksum_table(results, copy_threads))
    out.print(_copy_alone_table(results, copy_threads, backend, hash_thread))
    if backend == "host_copy":
        out.print(_paths_table(results, hash_thread))
        out.print(_restore_paths_table(results, copy_threads))
        if native.available() is not None:
            out.print(_copiers_table(results, stack.native_copy))
    for note in notes:
        out.print(note, soft_wrap=True, highlight=False)
    failed = [r for r in results if not r.exact]
    for r in failed:
        out.print(
            f"[red]FAIL[/red] {tier} {human(r.size)}: restored KV is not bit-exact: {r.mismatch}"
        )
    out.print(_verdict(tier, results, backend), soft_wrap=True, highlight=False)
    if tier != "disk":
        out.print(_copy_alone_verdict(results, backend), soft_wrap=True, highlight=False)
    return 1 if failed else 0


def _backend_problem(backend: str, tier: str, copy_threads: int, hash_thread: bool) -> str | None:
    """Why ``backend`` (tpu_sync or jax_memkind) cannot be benched with these flags."""
    if tier != "dram":
        where = "TPU Sync's host memory" if backend == "tpu_sync" else "a dram tier"
        return f"--backend {backend} parks into {where}: --tier dram only"
    if copy_threads != 1:
        workers = "TPU Sync's own workers" if backend == "tpu_sync" else "jax.device_put"
        return (
            f"--copy-threads is host_copy's dma.copy_threads; --backend {backend} copies with "
            f"{workers}: leave it at 1, got {copy_threads}"
        )
    if hash_thread:
        return f"--hash-thread is host_copy's dma.hash_thread; --backend {backend} has no checksum"
    if backend == "jax_memkind":
        try:
            select_transfer("jax_memkind")
        except ConfigError as exc:
            return f"--backend jax_memkind: {exc.message}"
    return None


def _threaded_copyto(
    threads: int, cleanup: contextlib.ExitStack
) -> Callable[[np.ndarray, np.ndarray], None] | None:
    """``np.copyto`` split into ``threads`` page-aligned parts, one per thread; None for 1."""
    if threads == 1:
        return None
    workers = ThreadPoolExecutor(threads - 1, thread_name_prefix="bench-copyto")
    cleanup.callback(workers.shutdown)

    def copy(dst: np.ndarray, src: np.ndarray) -> None:
        step = -(-src.size // threads // 4096) * 4096
        futures = [
            workers.submit(np.copyto, dst[i : i + step], src[i : i + step])
            for i in range(step, src.size, step)
        ]
        np.copyto(dst[:step], src[:step])
        for future in futures:
            future.result()

    return copy


def _argument_problem(
    sizes: Sequence[int], repeats: int, tier: str, directory: Path | None
) -> str | None:
    if tier not in TIERS:
        return f"--tier must be one of {', '.join(TIERS)}, got {tier!r}"
    if repeats < 1:
        return f"--repeats must be >= 1, got {repeats}"
    bad = [s for s in sizes if s <= 0 or s % TOKEN_BYTES]
    if not sizes or bad:
        return (
            f"each size must be a positive multiple of {TOKEN_BYTES // KiB} KiB "
            f"(the KV of one token); got {', '.join(map(human, bad)) or 'none'}"
        )
    if tier == "dram":
        return None if directory is None else "--dir is for the shm and disk tiers only"
    parent = directory if directory is not None else _default_parent(tier)
    assert parent is not None
    if not parent.is_dir():
        return f"--dir {parent} is not a directory"
    mount = filesystem_of(parent)
    if tier == "disk" and mount is not None and mount[1] in MEMORY_FILESYSTEMS:
        return (
            f"{parent} is on {mount[1]} ({mount[0]}), which is memory, not a disk: "
            "pass --dir on a disk-backed filesystem"
        )
    # The tier file, plus (disk) the plain reference file; a margin for the headers.
    need = max(sizes) * (2 if tier == "disk" else 1) + 64 * MiB
    st = os.statvfs(parent)
    if st.f_bavail * st.f_frsize < need:
        return (
            f"{parent} has {human(st.f_bavail * st.f_frsize)} free; "
            f"the {tier} bench needs about {need / GiB:.1f} GiB there"
        )
    return None


def _default_parent(tier: str) -> Path | None:
    if tier == "shm":
        return SHM_ROOT
    if tier == "disk":
        return Path.cwd()
    return None


# ---- one size ----------------------------------------------------------------------------


def _bench_size(
    stack: _Stack,
    size: int,
    repeats: int,
    seed: int,
    step: Callable[[str], None],
    tier_dir: Path | None,
    ncopy: Callable[[np.ndarray, np.ndarray], None] | None = None,
) -> SizeResult:
    parking, engine, tier = stack.parking, stack.engine, stack.tier
    checksummed = stack.checksummed
    result = SizeResult(size, tier.name, copy_threads=stack.copy_threads, backend=stack.backend)
    session_id = f"kv-{size}"
    num_blocks = size // engine.geometry.block_nbytes
    num_tokens = size // TOKEN_BYTES
    rng = np.random.default_rng(seed)

    parking.create(TENANT, session_id, {"bench": "transfer", "kv_bytes": size})
    key = (TENANT, session_id)
    plain: PlainFile | None = None
    put: PinnedPut | None = None
    try:
        blocks = engine.allocator.allocate(key, num_blocks)
        expected = _fill_blocks(stack, blocks, rng)  # the bytes the session must get back
        tokens = rng.integers(0, engine.vocab_size, num_tokens).tolist()
        stack.driver.adopt_kv(TENANT, session_id, tokens, blocks, np.zeros(engine.vocab_size, "f4"))
        result.mismatch = pool_mismatch(engine, expected, blocks, "after fill")
        # The reference timed just before a pause (d2h) and a restore (h2d).
        ref_d2h: Callable[[], object]
        ref_h2d: Callable[[], object]
        if stack.backend == "jax_memkind":
            put = PinnedPut(size, _pool_device(engine))
            ref_d2h, ref_h2d = put.d2h, put.h2d
        else:
            src, dst = prefaulted(size), prefaulted(size)
            ref_d2h, ref_h2d = partial(np.copyto, dst, src), partial(np.copyto, src, dst)

        def measure(name: str, fn: Callable[..., object], *args: object) -> None:
            op = result.op(name)
            op.ref1.append(timed(ref_h2d if name.startswith(("h2d", "restore")) else ref_d2h))
            if ncopy is not None:
                op.refn.append(timed(ncopy, dst, src))
            op.s.append(timed(fn, *args))

        if tier.name == "disk":
            assert tier_dir is not None
            plain = PlainFile(tier_dir / f"plain-{size}.bin", size)
        if result.exact:
            # Warm-up, untimed: SQLite, caches, the tier's pages. A pause whose tier slots
            # wrap around the end of the tier restores as two runs; cycling through the whole
            # tier once also meets every window shape (compiled by transfer.warmup already).
            ref_d2h()
            ref_h2d()
            if plain is not None:
                plain.write(src)
                plain.read(dst)
            for _ in range(-(-tier.capacity_blocks // num_blocks) + 1):
                _round_trip(parking, session_id, tier.name)
            after = _blocks_of(engine, key)
            result.mismatch = pool_mismatch(engine, expected, after, "after warm-up")
        step("warm-up")
        for _ in range(repeats if result.exact else 0):
            result.copy_before_pause_s.append(timed(ref_d2h))
            if ncopy is not None:
                result.ncopy_before_pause_s.append(timed(ncopy, dst, src))
            if plain is not None:
                result.file_write_s.append(timed(plain.write, src))
            result.pause_s.append(timed(park, parking, session_id, tier.name))
            if checksummed:
                slots = _parked_slots(parking, session_id)
                result.checksum_s.append(timed(checksum, tier, slots))
            step("pause")
            result.copy_before_restore_s.append(timed(ref_h2d))
            if ncopy is not None:
                result.ncopy_before_restore_s.append(timed(ncopy, src, dst))
            if plain is not None:
                result.file_read_s.append(timed(plain.read, dst))
            result.restore_s.append(timed(restore, parking, session_id, tier.name))
            seen = getattr(stack.transfer, "observer", None)
            if isinstance(seen, LastRestorePath) and seen.last is not None:
                stack.restore_paths.add(seen.last)
            step("restore")
            if checksummed:  # host_copy only (see the module doc)
                parking.mover.checksum_tiers = frozenset({tier.name})
                try:
                    measure("pause+xxh3", park, parking, session_id, tier.name)
                    measure("restore+xxh3", restore, parking, session_id, tier.name)
                finally:
                    parking.mover.checksum_tiers = frozenset()
                step("checksum on")
            _copy_alone(stack, key, measure)
            step("copy alone")
        if result.exact:
            after = _blocks_of(engine, key)
            result.mismatch = pool_mismatch(engine, expected, after, "after repeats")
        step("verified")
    finally:
        if plain is not None:
            plain.close()
        if put is not None:
            put.close()
        parking.delete(TENANT, session_id)
    return result


def _copy_alone(stack: _Stack, key: tuple[str, str], measure: Callable[..., None]) -> None:
    """The copy without the control plane: the session's blocks to spare tier slots and
    back into the same blocks (the same bytes), checksum off and on (off only for tpu_sync)."""
    engine, tier, dma = stack.engine, stack.tier, stack.transfer
    blocks = _blocks_of(engine, key)
    slots = tier.allocate("bench-copy-alone", len(blocks))
    digests = ((False, ""), (True, "+xxh3")) if stack.checksummed else ((False, ""),)
    try:
        for digest, suffix in digests:
            measure(f"d2h{suffix}", dma.d2h, engine, blocks, tier, slots, digest)
            measure(f"h2d{suffix}", dma.h2d, tier, slots, engine, blocks, digest)
        if stack.checksummed and isinstance(dma, HostCopyTransfer):
            # The other checksum path, in the same repeat: hash thread <-> fused.
            dma.hash_thread = not stack.hash_thread
            try:
                measure("d2h+xxh3 alt", dma.d2h, engine, blocks, tier, slots, True)
                measure("h2d+xxh3 alt", dma.h2d, tier, slots, engine, blocks, True)
            finally:
                dma.hash_thread = stack.hash_thread
            if native.available() is not None:
                # The other copy loop, in the same repeat: native kernel <-> numpy.
                other = _other_copier(stack.native_copy)
                dma.native_copy = not stack.native_copy
                try:
                    for digest, suffix in digests:
                        measure(
                            f"d2h{suffix} {other}", dma.d2h, engine, blocks, tier, slots, digest
                        )
                        measure(
                            f"h2d{suffix} {other}", dma.h2d, tier, slots, engine, blocks, digest
                        )
                finally:
                    dma.native_copy = stack.native_copy
            # The restore through XLA's donated writes, in the same repeat (A/B).
            dma.in_place = False
            try:
                measure("h2d xla", dma.h2d, tier, slots, engine, blocks, False)
                measure("h2d+xxh3 xla", dma.h2d, tier, slots, engine, blocks, True)
            finally:
                dma.in_place = True
    finally:
        tier.free("bench-copy-alone")


def _pool_device(engine: EngineAdapter) -> jax.Device:
    """The device the pool lives on (the bench's engine is on one device)."""
    with engine.lock:
        pool = engine.kv_pool()[0]
        return next(iter(pool.sharding.device_set))


def _round_trip(parking: SessionCore, session_id: str, tier: str) -> None:
    park(parking, session_id, tier)
    restore(parking, session_id, tier)


def _parked_slots(parking: SessionCore, session_id: str) -> list[int]:
    handle = parking.get(TENANT, session_id).parked_handle or {}
    return list(handle["slots"])


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
    stack.filler.h2d(scratch, slots, engine, blocks)
    return buffers


# ---- geometry and report -----------------------------------------------------------------


def _block_tokens(sizes: Sequence[int]) -> int:
    """The largest power of two <= MAX_BLOCK_TOKENS tokens that divides every size."""
    tokens = math.gcd(*(s // TOKEN_BYTES for s in sizes))
    block = 1
    while block * 2 <= MAX_BLOCK_TOKENS and tokens % (block * 2) == 0:
        block *= 2
    return block


def _ratio_cell(ratios: Sequence[float], target: float | None) -> str:
    ratio = statistics.median(ratios)
    style = "red" if target is not None and ratio < target else "green"
    return f"[{style}]{ratio:.2f}[/{style}] ({min(ratios):.2f}-{max(ratios):.2f})"


def _table(
    tier: str, results: Sequence[SizeResult], threads: int = 1, backend: str = "host_copy"
) -> Table:
    disk = tier == "disk"
    memkind = backend == "jax_memkind"
    flags = f"--tier {tier}" + (f" --backend {backend}" if backend != "host_copy" else "")
    title = f"agentpark bench transfer {flags}: SessionCore.pause/resume vs {_reference(backend)}"
    table = Table(title=title + (" and a plain file write/read" if disk else ""))
    names = ["KV/session", "pause GB/s", "restore GB/s"]
    names += ["put d2h GB/s", "put h2d GB/s"] if memkind else ["copyto GB/s"]
    names += ["pause ratio", "restore ratio"]
    if threads > 1:
        names += [f"copyto x{threads} GB/s", f"pause/x{threads}", f"restore/x{threads}"]
    if disk:
        names += ["write GB/s", "read GB/s", "pause/write", "restore/read"]
    for name in names:
        table.add_column(name, justify="right")
    table.add_column("bit-exact", justify="center")
    for r in results:
        if not r.pause_s:
            table.add_row(human(r.size), *["-"] * (len(names) - 1), "[red]NO[/red]")
            continue
        judged = r.size >= TARGET_FROM
        cells = [human(r.size), spread(r.pause_gbps), spread(r.restore_gbps)]
        if memkind:
            cells += [spread(r.copy_before_pause_gbps), spread(r.copy_before_restore_gbps)]
        else:
            cells.append(spread(r.copy_before_pause_gbps + r.copy_before_restore_gbps))
        memcpy_target = r.target if judged and not disk else None
        cells.append(_ratio_cell(r.pause_ratios, memcpy_target))
        cells.append(_ratio_cell(r.restore_ratios, memcpy_target))
        if threads > 1:
            cells.append(spread(r._gbps(r.ncopy_before_pause_s + r.ncopy_before_restore_s)))
            cells += [_ratio_cell(r.pause_nratios, None), _ratio_cell(r.restore_nratios, None)]
        if disk:
            file_target = DISK_TARGET_RATIO if judged else None
            cells += [spread(r.file_write_gbps), spread(r.file_read_gbps)]
            cells.append(_ratio_cell(r.pause_file_ratios, file_target))
            cells.append(_ratio_cell(r.restore_file_ratios, file_target))
        cells.append("[green]yes[/green]" if r.exact else "[red]NO[/red]")
        table.add_row(*cells)
    return table


def _checksum_table(results: Sequence[SizeResult], threads: int = 1) -> Table:
    tier = results[0].tier if results else "?"
    table = Table(
        title=f"what the checksum costs ({tier}): SessionCore.pause/resume with the tier "
        "checksummed (hashed as it copies), vs np.copyto"
    )
    names = ["KV/session", "pause GB/s", "restore GB/s", "pause ratio", "restore ratio"]
    if threads > 1:
        names += [f"pause/x{threads}", f"restore/x{threads}"]
    names += ["xxh3 alone GB/s", "+ on pause", "+ on restore"]
    for name in names:
        table.add_column(name, justify="right")
    for r in results:
        pause, resume = r.ops.get("pause+xxh3"), r.ops.get("restore+xxh3")
        if pause is None or resume is None or not r.checksum_s:
            table.add_row(human(r.size), *["-"] * (len(names) - 1))
            continue
        target = TARGET_RATIO if r.size >= TARGET_FROM and tier != "disk" else None
        cells = [human(r.size), spread(r._gbps(pause.s)), spread(r._gbps(resume.s))]
        cells += [_ratio_cell(pause.ratios, target), _ratio_cell(resume.ratios, target)]
        if threads > 1:
            cells += [_ratio_cell(pause.nratios, None), _ratio_cell(resume.nratios, None)]
        cells.append(spread(r.checksum_gbps))
        cells += [f"{r.checksum_pause_cost:+.0%}", f"{r.checksum_restore_cost:+.0%}"]
        table.add_row(*cells)
    return table


_ALONE = ("d2h", "h2d", "d2h+xxh3", "h2d+xxh3")
_ALONE_UNCHECKED = ("d2h", "h2d")  # tpu_sync and jax_memkind: checksum off only
_DMA_CLASS = {
    "host_copy": "HostCopyTransfer",
    "jax_memkind": "JaxMemkindTransfer",
    "tpu_sync": "TpuSyncTransfer",
}


def _alone_ops(backend: str) -> tuple[str, ...]:
    return _ALONE if backend == "host_copy" else _ALONE_UNCHECKED


def _reference(backend: str) -> str:
    """The reference each ratio divides by, as the tables name it."""
    return "a plain pinned jax.device_put" if backend == "jax_memkind" else "np.copyto"


def _target(backend: str) -> float:
    return MEMKIND_TARGET_RATIO if backend == "jax_memkind" else TARGET_RATIO


def _path(hash_thread: bool) -> str:
    return "hash thread" if hash_thread else "fused"


def _copy_alone_table(
    results: Sequence[SizeResult],
    threads: int = 1,
    backend: str = "host_copy",
    hash_thread: bool = False,
) -> Table:
    tier = results[0].tier if results else "?"
    dma = _DMA_CLASS[backend]
    table = Table(
        title=f"the copy alone ({tier}): {dma}.d2h/h2d, no SQLite, over {_reference(backend)}"
    )
    alone = _alone_ops(backend)
    heads = ["pause", "restore", "pause+xxh3", "restore+xxh3"][: len(alone)]
    if backend == "host_copy":
        here = _path(hash_thread)
        heads = [*heads[:2], f"pause+xxh3 ({here})", f"restore+xxh3 ({here})"]
    names = ["KV/session", *heads]
    if threads > 1:
        names += [f"{h}/x{threads}" for h in heads]
    for name in names:
        table.add_column(name, justify="right")
    for r in results:
        ops = [r.ops.get(name) for name in alone]
        if any(op is None or not op.s for op in ops):
            table.add_row(human(r.size), *["-"] * (len(names) - 1))
            continue
        target = r.target if r.size >= TARGET_FROM and tier != "disk" else None
        cells = [human(r.size), *(_ratio_cell(op.ratios, target) for op in ops if op)]
        if threads > 1:
            cells += [_ratio_cell(op.nratios, None) for op in ops if op]
        table.add_row(*cells)
    return table


def _paths_table(results: Sequence[SizeResult], hash_thread: bool = False) -> Table:
    """The two checksum paths of the copy alone, timed in the same repeats."""
    tier = results[0].tier if results else "?"
    table = Table(
        title=f"checksum on, fused vs hash thread ({tier}): HostCopyTransfer.d2h/h2d alone, "
        "over np.copyto"
    )
    # Op names: the configured path is "d2h+xxh3", the other one "d2h+xxh3 alt".
    fused, threaded = ("alt", "") if hash_thread else ("", "alt")
    pairs = [(f"{d}+xxh3 {fused}".strip(), f"{d}+xxh3 {threaded}".strip()) for d in ("d2h", "h2d")]
    names = ["KV/session", "pause fused", "pause hash thread"]
    names += ["restore fused", "restore hash thread"]
    for name in names:
        table.add_column(name, justify="right")
    for r in results:
        ops = [r.ops.get(name) for pair in pairs for name in pair]
        if any(op is None or not op.s for op in ops):
            table.add_row(human(r.size), *["-"] * (len(names) - 1))
            continue
        target = TARGET_RATIO if r.size >= TARGET_FROM and tier != "disk" else None
        table.add_row(human(r.size), *(_ratio_cell(op.ratios, target) for op in ops if op))
    return table


def _other_copier(native_copy: bool) -> str:
    """The copy loop the A/B times beside the configured one (op-name suffix)."""
    return "numpy" if native_copy else "kernel"


def _copiers_table(results: Sequence[SizeResult], native_copy: bool = True) -> Table:
    """The copy alone through the native kernel and through numpy, in the same repeats:
    a row per size and copy loop."""
    tier = results[0].tier if results else "?"
    table = Table(
        title=f"native kernel vs numpy ({tier}): HostCopyTransfer.d2h/h2d alone, over np.copyto"
    )
    other = _other_copier(native_copy)
    ops = ("d2h", "h2d", "d2h+xxh3", "h2d+xxh3")
    names = {"kernel": ops, "numpy": tuple(f"{op} {other}" for op in ops)}
    if not native_copy:
        names = {"kernel": names["numpy"], "numpy": ops}
    heads = ["KV/session", "copy loop", "pause", "restore", "pause+xxh3", "restore+xxh3"]
    for head in heads:
        table.add_column(head, justify="right")
    for r in results:
        target = TARGET_RATIO if r.size >= TARGET_FROM and tier != "disk" else None
        for copier, op_names in names.items():
            cells = [r.ops.get(name) for name in op_names]
            if any(op is None or not op.s for op in cells):
                table.add_row(human(r.size), copier, *["-"] * len(op_names))
                continue
            ratios = (_ratio_cell(op.ratios, target) for op in cells if op)
            table.add_row(human(r.size), copier, *ratios)
    return table


def _restore_paths_table(results: Sequence[SizeResult], threads: int = 1) -> Table:
    """The restore of the copy alone, in place and through XLA, timed in the same repeats."""
    tier = results[0].tier if results else "?"
    table = Table(
        title=f"restore, in place vs XLA ({tier}): HostCopyTransfer.h2d alone, over np.copyto"
    )
    pairs = [("h2d", "h2d xla"), ("h2d+xxh3", "h2d+xxh3 xla")]
    heads = ["restore in place", "restore XLA", "restore+xxh3 in place", "restore+xxh3 XLA"]
    names = ["KV/session", *heads]
    if threads > 1:
        names += [f"{h}/x{threads}" for h in heads]
    for name in names:
        table.add_column(name, justify="right")
    for r in results:
        ops = [r.ops.get(name) for pair in pairs for name in pair]
        if any(op is None or not op.s for op in ops):
            table.add_row(human(r.size), *["-"] * (len(names) - 1))
            continue
        target = TARGET_RATIO if r.size >= TARGET_FROM and tier != "disk" else None
        cells = [human(r.size), *(_ratio_cell(op.ratios, target) for op in ops if op)]
        if threads > 1:
            cells += [_ratio_cell(op.nratios, None) for op in ops if op]
        table.add_row(*cells)
    return table


def _notes(stack: _Stack, tier: str, tier_dir: Path | None, repeats: int) -> list[str]:
    geometry = stack.engine.geometry
    tier_bytes = stack.tier.capacity_blocks * geometry.block_nbytes
    threads = stack.copy_threads
    threads_note = f"dma.copy_threads = {threads}" + (
        f"; /x{threads} columns divide by an np.copyto split over {threads} threads."
        if threads > 1
        else "."
    )
    if stack.checksummed:
        tables = (
            "with checksums off in the first table and on in the second; the third times "
            f"HostCopyTransfer.d2h/h2d alone. {threads_note}"
        )
    else:
        dma = _DMA_CLASS[stack.backend]
        tables = f"with checksums off; the second table times {dma}.d2h/h2d alone."
    reference = (
        "a plain jax.device_put of one array of the same bytes, from the device's memory to "
        "pinned_host before a pause (put d2h) and back before a restore (put h2d), blocked "
        "until ready"
        if stack.backend == "jax_memkind"
        else "same size, preallocated, pre-faulted buffers"
    )
    notes = [
        f"GB = 1e9 bytes; median (min-max) of {repeats} repeats; a ratio is, per repeat, the "
        f"operation's GB/s over the reference run just before it ({reference}); pause and "
        "restore are timed around SessionCore.pause/resume "
        f"(SQLite writes included), {tables}",
        f"pool {geometry.num_blocks} blocks x {human(geometry.block_nbytes)} "
        f"({geometry.block_size} tokens), {tier} tier {human(tier_bytes)}, "
        f"dma {stack.transfer.name}, jax {jax.__version__} ({jax.default_backend()}), "
        f"numpy {np.__version__}.",
    ]
    if stack.backend == "jax_memkind":
        notes.append(_memkind_note(stack))
    elif stack.checksummed:
        kernel = native.available()
        if stack.hash_thread:
            path = (
                "numpy copies, hashed on a second thread, 4 MiB spans behind the pause's copy "
                "and beside the restore's write (the copier hashes a span itself when that "
                "thread is two spans behind)"
            )
        elif stack.native_copy:
            path = (
                f"the native kernel ({kernel} path) copies and hashes in one pass, each "
                "64-byte stripe loaded once, stored with non-temporal stores and folded into "
                "the piece's xxh3 (pause: from the pool; restore: from the tier)"
            )
        else:
            path = (
                "numpy copies; hashed by the copying thread just before it copies the piece, "
                "which then reads it from cache (pause: from the pool; restore: from the tier)"
            )
        path = (
            f"dma.hash_thread = {str(stack.hash_thread).lower()}, dma.native_copy = "
            f"{str(stack.native_copy).lower()}: {path}"
        )
        if kernel is None:
            path += "; the native kernel is not built here"
        else:
            path += (
                ". The kernel-vs-numpy table times both copy loops of the copy alone in the "
                "same repeats"
            )
        notes.append(
            f"checksum: xxh3-64 per 1 MiB piece; {path}; '+ on pause/restore' is the "
            "checksum-on time over the checksum-off one. 'xxh3 alone' is integrity.checksum "
            "over the parked copy (one core). The fused-vs-hash-thread table times both paths "
            "of the copy alone in the same repeats."
        )
        copier = stack.transfer
        if isinstance(copier, HostCopyTransfer):
            went = " and ".join(sorted(stack.restore_paths)) or "-"
            notes.append(
                "restore: in place (numpy writes into the pool arrays' own memory, "
                "dma.host_copy.in_place) where the pool allows it, else XLA's donated writes; "
                f"the session core's restores here went {went}. The "
                "in-place-vs-XLA table times both for the copy alone in the same repeats."
            )
    else:
        notes.append(
            f"tpu_sync: TPU Sync's real KVCacheManager (tpu-sync-jax {tpu_sync_version()}) "
            f"on JAX's {jax.default_backend()!r} platform"
            + (
                " (allowed for the bench as dma.tpu_sync_on_cpu): it copies between host "
                "buffers here, so these figures say nothing about a TPU's DMA engine; no "
                "checksum row, agentpark cannot read TPU Sync's host blocks."
                if jax.default_backend() == "cpu"
                else "; no checksum row, agentpark cannot read TPU Sync's host blocks."
            )
        )
    if tier_dir is not None:
        mount = filesystem_of(tier_dir)
        where = f"{mount[1]} on {mount[0]}" if mount else "unknown filesystem"
        notes.append(f"{tier} tier file in {tier_dir} ({where}); removed at the end.")
    if tier == "disk":
        notes.append(
            "disk: the reference is a plain preallocated file of the same size, written with "
            "os.pwrite + os.fsync and read with os.preadv into a pre-faulted buffer. Pause is "
            "a copy into the tier's MAP_SHARED mapping, then msync + fsync. Reads are served "
            "by the page cache, not the device: both the plain read and the restore (which "
            "reads the tier through its mmap) find the bytes just written still cached, so "
            "they measure memory, and only the write side (fsync) touches the disk."
        )
    return notes


def _memkind_note(stack: _Stack) -> str:
    """Where jax_memkind ran: the platform and device, so a GPU run's output says so."""
    device = _pool_device(stack.engine)
    platform = jax.default_backend()
    note = (
        f"jax_memkind ran on JAX platform {platform!r}, device {device.device_kind!r} "
        f"({device}); the pool is in the 'device' memory kind, parked rows go through "
        "'pinned_host'; checksum off only (host_copy's bench measures the xxh3 cost)."
    )
    if platform == "cpu":
        note += (
            " On the CPU platform 'device' and 'pinned_host' are both host memory, so these "
            "figures say nothing about a GPU (or TPU) DMA: run deploy/gpu-check.sh on a GPU host."
        )
    return note


def _copy_alone_verdict(results: Sequence[SizeResult], backend: str = "host_copy") -> str:
    checked = "checksum off and on" if backend == "host_copy" else "checksum off"
    target = _target(backend)
    head = (
        f"the copy alone: ratio >= {target} {_of_reference(backend)}from {human(TARGET_FROM)} "
        f"up, {checked}: "
    )
    judged = [r for r in results if r.size >= TARGET_FROM and r.ops.get("d2h")]
    if not judged:
        return head + "no size to judge"
    misses = [
        f"{name} at {human(r.size)} ({statistics.median(r.ops[name].ratios):.2f})"
        for r in judged
        for name in _alone_ops(backend)
        if statistics.median(r.ops[name].ratios) < target
    ]
    return head + ("met" if not misses else "MISSED: " + ", ".join(misses))


def _of_reference(backend: str) -> str:
    """What a verdict's ratio is to, when it is not single-thread np.copyto ('' then)."""
    if backend != "jax_memkind":
        return ""
    return "of a plain pinned jax.device_put of the same bytes (d2h: pause, h2d: restore) "


def _verdict(tier: str, results: Sequence[SizeResult], backend: str = "host_copy") -> str:
    if tier == "disk":
        head = (
            f"target: pause/restore >= {DISK_TARGET_RATIO} of the plain file write/read from "
            f"{human(TARGET_FROM)} up: "
        )
    else:
        checked = "checksum off and on" if backend == "host_copy" else "checksum off"
        head = (
            f"target: ratio >= {_target(backend)} {_of_reference(backend)}from "
            f"{human(TARGET_FROM)} up, both directions, {checked}: "
        )
    judged = [r for r in results if r.size >= TARGET_FROM and r.pause_s]
    if not judged:
        return head + "no size to judge"
    misses = [
        f"{name} at {human(r.size)} ({statistics.median(ratios):.2f})"
        for r in judged
        for name, ratios, target in r.judged()
        if statistics.median(ratios) < target
    ]
    return head + ("met" if not misses else "MISSED: " + ", ".join(misses))
