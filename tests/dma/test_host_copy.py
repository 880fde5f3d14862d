"""host_copy moves blocks bit-exact between a real JAX pool and a real tier buffer."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xxhash

from agentpark import integrity
from agentpark.blocks import ArraySpec, PoolGeometry, contiguous_runs
from agentpark.dma import HostCopyTransfer, native
from agentpark.dma.host_copy import native_loop, numpy_loop
from agentpark.engine.reference import ModelSpec, PoolSpec, ReferenceEngine
from agentpark.tiers.dram import DramTier


def test_contiguous_runs() -> None:
    assert contiguous_runs([]) == []
    assert contiguous_runs([4]) == [(0, 4, 1)]
    assert contiguous_runs([3, 4, 5, 9, 10, 2]) == [(0, 3, 3), (3, 9, 2), (5, 2, 1)]


@pytest.fixture
def engine() -> ReferenceEngine:
    return ReferenceEngine(ModelSpec(max_seq_len=256), PoolSpec(block_size=16, num_blocks=32))


def _fill(engine: ReferenceEngine) -> np.ndarray:
    """Random bytes in every block of the pool, written through the DMA core itself."""
    rng = np.random.default_rng(7)
    scratch = DramTier(engine.geometry, engine.geometry.total_bytes)
    (buf,) = scratch.buffers()
    buf[...] = rng.integers(0, 2**16, size=buf.shape, dtype=np.uint16)
    slots = scratch.allocate("fill", engine.geometry.num_blocks)
    HostCopyTransfer().h2d(scratch, slots, engine, list(range(engine.geometry.num_blocks)))
    return buf.copy()


@pytest.mark.parametrize(
    ("blocks", "tier_blocks_taken_first"),
    [([0, 1, 2, 3], 0), ([9, 2, 17, 18, 19, 5], 3), (list(range(31, -1, -1)), 1)],
)
def test_round_trip_is_bit_exact_into_other_blocks(
    engine: ReferenceEngine, blocks: list[int], tier_blocks_taken_first: int
) -> None:
    original = _fill(engine)
    tier = DramTier(engine.geometry, 40 * engine.geometry.block_nbytes)
    tier.allocate("other", tier_blocks_taken_first)  # so slots do not start at 0
    slots = tier.allocate("s", len(blocks))
    dma = HostCopyTransfer()
    dma.d2h(engine, blocks, tier, slots)
    (buf,) = tier.buffers()
    np.testing.assert_array_equal(buf[slots], original[blocks])

    targets = [(b + 11) % 32 for b in blocks]  # restore into different blocks
    untouched = [b for b in range(32) if b not in targets]
    dma.h2d(tier, slots, engine, targets)
    pool = np.asarray(engine.kv_pool()[0])
    np.testing.assert_array_equal(pool[targets], original[blocks])
    np.testing.assert_array_equal(pool[untouched], original[untouched])


def test_restore_near_the_end_of_the_tier_uses_a_shifted_window(engine: ReferenceEngine) -> None:
    original = _fill(engine)
    tier = DramTier(engine.geometry, 7 * engine.geometry.block_nbytes)
    tier.allocate("head", 4)
    slots = tier.allocate("s", 3)  # slots 4..6: a bucket of 4 would run past the end
    assert slots == [4, 5, 6]
    dma = HostCopyTransfer()
    dma.d2h(engine, [1, 2, 3], tier, slots)
    dma.h2d(tier, slots, engine, [20, 21, 22])
    pool = np.asarray(engine.kv_pool()[0])
    np.testing.assert_array_equal(pool[[20, 21, 22]], original[[1, 2, 3]])
    np.testing.assert_array_equal(pool[:20], original[:20])
    np.testing.assert_array_equal(pool[23:], original[23:])


def test_mismatched_lengths_are_refused(engine: ReferenceEngine) -> None:
    tier = DramTier(engine.geometry, 4 * engine.geometry.block_nbytes)
    with pytest.raises(ValueError, match="2 block ids but 1 slots"):
        HostCopyTransfer().d2h(engine, [0, 1], tier, [0])


@pytest.mark.parametrize(
    "targets",
    [list(range(5, 25)), list(range(0, 9)) + list(range(20, 31))],  # one run; two runs >= 8
)
def test_long_consecutive_runs_restore_by_slice_writes_bit_exact(
    engine: ReferenceEngine, targets: list[int]
) -> None:
    original = _fill(engine)
    blocks = list(range(32))[: len(targets)]
    tier = DramTier(engine.geometry, 32 * engine.geometry.block_nbytes)
    slots = tier.allocate("s", len(blocks))
    dma = HostCopyTransfer()
    dma.d2h(engine, blocks, tier, slots)
    dma.h2d(tier, slots, engine, targets)
    pool = np.asarray(engine.kv_pool()[0])
    np.testing.assert_array_equal(pool[targets], original[blocks])
    untouched = [b for b in range(32) if b not in targets]
    np.testing.assert_array_equal(pool[untouched], original[untouched])


def test_warmup_compiles_without_writing(engine: ReferenceEngine) -> None:
    original = _fill(engine)
    tier = DramTier(engine.geometry, 20 * engine.geometry.block_nbytes)
    tier.buffers()[0][...] = 7  # anything the warm-up wrote would show up as 7s
    before = engine.kv_pool()[0].unsafe_buffer_pointer()
    HostCopyTransfer().warmup(engine, tier)
    np.testing.assert_array_equal(np.asarray(engine.kv_pool()[0]), original)
    assert engine.kv_pool()[0].unsafe_buffer_pointer() == before  # in place, no pool copy


# ---- checksums fused into the copy, and copy_threads --------------------------------------


# Rows of 384 and 512 bytes (the native kernel takes them), or of 384 and 240 (a row not
# in whole 64-byte stripes: numpy only).
_KERNEL_ROWS = (ArraySpec((4, 6, 8), "uint16"), ArraySpec((4, 4, 8), "float32"))
_ODD_ROWS = (ArraySpec((4, 6, 8), "uint16"), ArraySpec((4, 3, 5), "float32"))


class TwoArrayPool:
    """The EngineAdapter surface host_copy uses, over two pool arrays of different shapes
    and dtypes (so the checksum's piece-then-array order is exercised)."""

    def __init__(self, num_blocks: int = 24, arrays: tuple[ArraySpec, ...] = _KERNEL_ROWS) -> None:
        self.geometry = PoolGeometry(num_blocks, 4, arrays)
        self.lock = threading.RLock()
        rng = np.random.default_rng(3)
        self.original = [
            rng.integers(0, 255, (num_blocks, spec.block_nbytes), dtype=np.uint8)
            .view(spec.dtype)
            .reshape(num_blocks, *spec.block_shape)
            for spec in self.geometry.arrays
        ]
        self._pool = [jnp.asarray(a) for a in self.original]

    def kv_pool(self) -> list[jax.Array]:
        return list(self._pool)

    def set_kv_pool(self, arrays: list[jax.Array]) -> None:
        self._pool = list(arrays)


def _independent_checksum(tier: DramTier, slots: list[int], k: int) -> str:
    """The checksum definition, written out again from the tier's bytes alone."""
    digests = b""
    for i in range(0, len(slots), k):
        for buf in tier.buffers():
            rows = b"".join(buf[s].tobytes() for s in slots[i : i + k])
            digests += xxhash.xxh3_64_digest(rows)
    return f"xxh3p:{xxhash.xxh3_64_hexdigest(digests)}"


@pytest.fixture
def three_block_pieces(monkeypatch: pytest.MonkeyPatch) -> Callable[[PoolGeometry], int]:
    """Pieces of 3 blocks, so copies cross many piece and chunk boundaries."""

    def use(geometry: PoolGeometry) -> int:
        monkeypatch.setattr(integrity, "PIECE_BYTES", 3 * geometry.block_nbytes)
        return 3

    return use


@dataclass
class CopyPath:
    """Which copy loop a test runs (``native_copy`` and the pool's rows), and a check that
    it ran: the native kernel's calls are counted."""

    engine: TwoArrayPool
    native_copy: bool
    kernel: bool  # whether the kernel must run
    calls: list[int] = field(default_factory=list)

    def check(self) -> None:
        assert bool(self.calls) == self.kernel, f"kernel calls: {len(self.calls)}"


_PATHS = {
    "kernel": (_KERNEL_ROWS, True),
    "numpy": (_KERNEL_ROWS, False),
    "odd rows": (_ODD_ROWS, True),
}


@pytest.fixture(params=list(_PATHS))
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> CopyPath:
    arrays, native_copy = _PATHS[request.param]
    chosen = CopyPath(TwoArrayPool(arrays=arrays), native_copy, request.param == "kernel")
    copy_rows = native.copy_rows

    def counted(*args: Any, **kwargs: Any) -> None:
        chosen.calls.append(1)
        copy_rows(*args, **kwargs)

    monkeypatch.setattr(native, "copy_rows", counted)
    return chosen


# Slots in an order with gaps and reversals; the session has 20 blocks, so the last piece
# is short (20 = 6 x 3 + 2).
_SLOTS = [*range(10, 17), 2, 3, 30, 29, 28, *range(18, 26)]


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("chunk_blocks", [1, 4, 7, 64])
def test_fused_pause_checksum_equals_an_independent_one_and_the_copy_is_exact(
    three_block_pieces: Callable[[PoolGeometry], int],
    path: CopyPath,
    threads: int,
    chunk_blocks: int,
) -> None:
    engine = path.engine
    k = three_block_pieces(engine.geometry)
    blocks = [5, 6, 7, 8, 0, 1, 23, 22, 9, 10, 11, 12, 13, 2, 3, 4, 14, 15, 16, 17]
    tier = DramTier(engine.geometry, 32 * engine.geometry.block_nbytes)
    # A chunk that is no whole number of blocks (and rounds down to whole pieces).
    dma = HostCopyTransfer(
        chunk_bytes=chunk_blocks * engine.geometry.block_nbytes + 5, native_copy=path.native_copy
    )
    dma.copy_threads = threads
    digest = dma.d2h(engine, blocks, tier, _SLOTS, digest=True)  # type: ignore[arg-type]
    for buf, original in zip(tier.buffers(), engine.original, strict=True):
        np.testing.assert_array_equal(buf[_SLOTS], original[blocks])
    assert digest == _independent_checksum(tier, _SLOTS, k)
    assert digest == integrity.checksum(tier, _SLOTS)
    path.check()


def test_the_checksum_does_not_depend_on_slots_threads_or_chunks(
    three_block_pieces: Callable[[PoolGeometry], int],
) -> None:
    engine = TwoArrayPool()
    three_block_pieces(engine.geometry)
    blocks = list(range(3, 20))
    seen = set()
    runs = [
        (1, 64, 0, True),
        (2, 3, 5, True),
        (4, 6, 11, True),
        (1, 64, 0, False),
        (2, 3, 7, False),
    ]
    for threads, chunk_blocks, first, native_copy in runs:  # the kernel's and numpy's
        tier = DramTier(engine.geometry, 32 * engine.geometry.block_nbytes)
        tier.allocate("other", first)
        slots = tier.allocate("s", len(blocks))
        dma = HostCopyTransfer(
            chunk_blocks * engine.geometry.block_nbytes, threads, native_copy=native_copy
        )
        seen.add(dma.d2h(engine, blocks, tier, slots, digest=True))  # type: ignore[arg-type]
    assert len(seen) == 1


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("chunk_blocks", [2, 7, 64])
def test_fused_restore_is_bit_exact_and_returns_the_pause_checksum(
    three_block_pieces: Callable[[PoolGeometry], int],
    path: CopyPath,
    threads: int,
    chunk_blocks: int,
) -> None:
    engine = path.engine
    three_block_pieces(engine.geometry)
    blocks = [5, 6, 7, 8, 0, 1, 23, 22, 9, 10, 11, 12, 13, 2, 3, 4, 14, 15, 16, 17]
    tier = DramTier(engine.geometry, 32 * engine.geometry.block_nbytes)
    dma = HostCopyTransfer(
        chunk_blocks * engine.geometry.block_nbytes + 1, threads, native_copy=path.native_copy
    )
    parked = dma.d2h(engine, blocks, tier, _SLOTS, digest=True)  # type: ignore[arg-type]
    # Into other blocks: a long consecutive run (slice writes) and scattered ones.
    targets = [(b + 3) % 24 for b in blocks]
    restored = dma.h2d(tier, _SLOTS, engine, targets, digest=True)  # type: ignore[arg-type]
    assert restored == parked
    untouched = [b for b in range(24) if b not in targets]
    for array, original in zip(engine.kv_pool(), engine.original, strict=True):
        pool = np.asarray(array)
        np.testing.assert_array_equal(pool[targets], original[blocks])
        np.testing.assert_array_equal(pool[untouched], original[untouched])
    path.check()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_flipped_byte_in_the_tier_changes_the_restore_checksum(
    three_block_pieces: Callable[[PoolGeometry], int], path: CopyPath, threads: int
) -> None:
    engine = path.engine
    three_block_pieces(engine.geometry)
    blocks = list(range(20))
    tier = DramTier(engine.geometry, 32 * engine.geometry.block_nbytes)
    dma = HostCopyTransfer(copy_threads=threads, native_copy=path.native_copy)
    parked = dma.d2h(engine, blocks, tier, _SLOTS, digest=True)  # type: ignore[arg-type]
    tier.buffers()[1][_SLOTS[-1]].view(np.uint8).flat[7] ^= 0x10  # last, short piece
    assert integrity.checksum(tier, _SLOTS) != parked
    restored = dma.h2d(tier, _SLOTS, engine, blocks, digest=True)  # type: ignore[arg-type]
    assert restored is not None and restored != parked
    path.check()


def test_without_digest_nothing_is_returned_and_threads_copy_exactly(
    engine: ReferenceEngine,
) -> None:
    original = _fill(engine)
    blocks = [9, 2, 17, 18, 19, 5, *range(20, 30)]
    tier = DramTier(engine.geometry, 40 * engine.geometry.block_nbytes)
    slots = tier.allocate("s", len(blocks))
    dma = HostCopyTransfer(chunk_bytes=5 * engine.geometry.block_nbytes, copy_threads=2)
    assert dma.d2h(engine, blocks, tier, slots) is None
    np.testing.assert_array_equal(tier.buffers()[0][slots], original[blocks])
    targets = [(b + 1) % 32 for b in blocks]
    assert dma.h2d(tier, slots, engine, targets) is None
    np.testing.assert_array_equal(np.asarray(engine.kv_pool()[0])[targets], original[blocks])


@pytest.mark.parametrize("threads", [0, 65])
def test_copy_threads_out_of_range_are_refused(threads: int) -> None:
    with pytest.raises(ValueError, match=r"copy_threads must be 1\.\.64"):
        HostCopyTransfer(copy_threads=threads)


def test_old_checksums_are_still_verified(engine: ReferenceEngine) -> None:
    """A copy parked before the per-piece definition carries ``xxh3:``: still checked."""
    _fill(engine)
    tier = DramTier(engine.geometry, 8 * engine.geometry.block_nbytes)
    slots = [4, 5, 1]
    HostCopyTransfer().d2h(engine, [0, 1, 2], tier, slots)
    (buf,) = tier.buffers()
    legacy = f"xxh3:{xxhash.xxh3_64_hexdigest(buf[slots].tobytes())}"
    assert not integrity.fusable(legacy)
    assert integrity.matches(tier, slots, legacy)
    buf[1].view(np.uint8).flat[0] ^= 1
    assert not integrity.matches(tier, slots, legacy)


# The pause's two fused copy loops: numpy's, and the native kernel's.
_GATHERS = {"numpy": (numpy_loop, "gather_rows"), "kernel": (native_loop, "copy_native")}


@pytest.mark.parametrize("copier", list(_GATHERS))
def test_a_failing_part_waits_for_the_other_threads_before_raising(
    engine: ReferenceEngine, monkeypatch: pytest.MonkeyPatch, copier: str
) -> None:
    """The copy must not return (letting the caller free the slots) while a worker writes."""
    finished: list[int] = []
    raised, release = threading.Event(), threading.Event()
    # The worker's part may finish only after this thread's part has failed: a copy that
    # returned without waiting would leave ``finished`` empty.
    threading.Thread(target=lambda: raised.wait(10) and release.set(), daemon=True).start()

    def gather(*args: object) -> list[bytes]:
        lo = args[-2]
        if lo == 0:  # the worker's part: held until the other part has raised
            assert release.wait(10)
            finished.append(0)
            return []
        raised.set()
        raise OSError("injected")  # this thread's part

    monkeypatch.setattr(*_GATHERS[copier], gather)
    tier = DramTier(engine.geometry, 8 * engine.geometry.block_nbytes)
    dma = HostCopyTransfer(copy_threads=2, native_copy=copier == "kernel")
    with pytest.raises(OSError, match="injected"):
        dma.d2h(engine, [0, 1, 2, 3], tier, [0, 1, 2, 3])
    assert finished == [0]
