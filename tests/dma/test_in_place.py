"""host_copy's in-place restore: numpy writes into the CPU pool's own memory, exact and safe.

Each test can tell the paths apart: an observer passed in hears which one each chunk took,
and the in-place tests make XLA's write functions raise, so a restore that went through
XLA fails them.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.layout import Format, Layout
from jax.sharding import SingleDeviceSharding

from agentpark import integrity
from agentpark.blocks import PoolGeometry
from agentpark.dma import HostCopyTransfer, host_copy
from agentpark.dma.host_copy import (
    NullObserver,
    RestorePath,
    in_place,
    native_loop,
    numpy_loop,
    xla,
)
from agentpark.engine.reference import ModelSpec, PoolSpec, ReferenceEngine
from agentpark.errors import TransferError
from agentpark.tiers.dram import DramTier
from tests.dma.test_host_copy import TwoArrayPool


class Paths(NullObserver):
    """The path each restore chunk took, in order."""

    def __init__(self) -> None:
        self.seen: list[RestorePath] = []

    def on_restore_path(self, path: RestorePath) -> None:
        self.seen.append(path)

    def took(self, path: RestorePath) -> bool:
        """Whether the last restore's chunks (since the last call) all went ``path``."""
        seen, self.seen = self.seen, []
        return bool(seen) and set(seen) == {path}


def _pointers(engine: TwoArrayPool | ReferenceEngine) -> list[int]:
    return [a.unsafe_buffer_pointer() for a in engine.kv_pool()]


@pytest.fixture
def no_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    """XLA's restore writes raise: a restore that is not in place fails."""

    def refuse(*args: object) -> None:
        raise AssertionError("restored through XLA")

    monkeypatch.setattr(xla, "slice_write", refuse)
    monkeypatch.setattr(xla, "scatter_write", refuse)


@pytest.fixture
def three_block_pieces(monkeypatch: pytest.MonkeyPatch) -> Callable[[PoolGeometry], int]:
    def use(geometry: PoolGeometry) -> int:
        monkeypatch.setattr(integrity, "PIECE_BYTES", 3 * geometry.block_nbytes)
        return 3

    return use


# 20 blocks into a 24-block pool: slots with gaps and reversals.
_SLOTS = [*range(10, 17), 2, 3, 30, 29, 28, *range(18, 26)]
_BLOCKS = [5, 6, 7, 8, 0, 1, 23, 22, 9, 10, 11, 12, 13, 2, 3, 4, 14, 15, 16, 17]
_TARGETS = {
    "contiguous": list(range(2, 22)),
    "scattered": [(b * 7 + 3) % 24 for b in _BLOCKS],
    "runs": [*range(12, 20), 0, 23, 1, 22, *range(2, 10)],
}


@pytest.mark.usefixtures("no_xla")
@pytest.mark.parametrize("targets", list(_TARGETS))
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("chunk_blocks", [4, 64])
@pytest.mark.parametrize("digest", [False, True])
def test_in_place_restore_is_bit_exact_and_checksums_the_tier(
    three_block_pieces: Callable[[PoolGeometry], int],
    targets: str,
    threads: int,
    chunk_blocks: int,
    digest: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = TwoArrayPool()
    three_block_pieces(engine.geometry)
    tier = DramTier(engine.geometry, 32 * engine.geometry.block_nbytes)
    paths = Paths()
    dma = HostCopyTransfer(chunk_blocks * engine.geometry.block_nbytes, threads, observer=paths)
    parked = dma.d2h(engine, _BLOCKS, tier, _SLOTS, digest=True)  # type: ignore[arg-type]
    ids = _TARGETS[targets]
    before = _pointers(engine)
    old = engine.kv_pool()
    got = dma.h2d(tier, _SLOTS, engine, ids, digest=digest)  # type: ignore[arg-type]
    assert paths.took("in place")
    assert got == (integrity.checksum(tier, _SLOTS) if digest else None)
    assert not digest or got == parked
    untouched = [b for b in range(24) if b not in ids]
    for array, original in zip(engine.kv_pool(), engine.original, strict=True):
        pool = np.asarray(array)
        np.testing.assert_array_equal(pool[ids], original[_BLOCKS])
        np.testing.assert_array_equal(pool[untouched], original[untouched])
    # The same buffers; the Arrays that held them before are gone (donated), so no other
    # Array over those buffers saw the write.
    assert _pointers(engine) == before
    assert all(a.is_deleted() for a in old)
    assert "copied the whole pool" not in caplog.text


@pytest.mark.parametrize("threads", [1, 2])
def test_both_paths_restore_the_same_bytes_and_checksum(
    three_block_pieces: Callable[[PoolGeometry], int], threads: int
) -> None:
    results = []
    for allowed in (True, False):
        engine = TwoArrayPool()
        three_block_pieces(engine.geometry)
        tier = DramTier(engine.geometry, 32 * engine.geometry.block_nbytes)
        paths = Paths()
        dma = HostCopyTransfer(copy_threads=threads, in_place=allowed, observer=paths)
        dma.d2h(engine, _BLOCKS, tier, _SLOTS)
        got = dma.h2d(tier, _SLOTS, engine, _TARGETS["scattered"], digest=True)  # type: ignore[arg-type]
        assert paths.took("in place" if allowed else "xla")
        results.append((got, [np.asarray(a).tobytes() for a in engine.kv_pool()]))
    assert results[0] == results[1]


@pytest.mark.usefixtures("no_xla")
@pytest.mark.parametrize("threads", [1, 2])
def test_a_flipped_byte_in_the_tier_changes_the_in_place_checksum(
    three_block_pieces: Callable[[PoolGeometry], int], threads: int
) -> None:
    engine = TwoArrayPool()
    three_block_pieces(engine.geometry)
    tier = DramTier(engine.geometry, 32 * engine.geometry.block_nbytes)
    paths = Paths()
    dma = HostCopyTransfer(copy_threads=threads, observer=paths)
    parked = dma.d2h(engine, _BLOCKS, tier, _SLOTS, digest=True)  # type: ignore[arg-type]
    tier.buffers()[0][_SLOTS[4]].view(np.uint8).flat[3] ^= 0x40
    restored = dma.h2d(tier, _SLOTS, engine, _BLOCKS, digest=True)  # type: ignore[arg-type]
    assert paths.took("in place")
    assert restored == integrity.checksum(tier, _SLOTS) != parked


# ---- when it is not used: the XLA path, still exact ----------------------------------------


def _column_major(arr: jax.Array) -> jax.Array:
    order = Layout(major_to_minor=tuple(range(arr.ndim))[::-1])
    return jax.device_put(arr, Format(order, SingleDeviceSharding(jax.devices()[0])))


@pytest.mark.parametrize("why", ["row-major", "in_place is off"])
def test_the_xla_path_is_taken_when_in_place_is_not_allowed(
    why: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = TwoArrayPool()
    tier = DramTier(engine.geometry, 32 * engine.geometry.block_nbytes)
    paths = Paths()
    dma = HostCopyTransfer(in_place=why != "in_place is off", observer=paths)
    dma.d2h(engine, _BLOCKS, tier, _SLOTS)
    if why == "row-major":  # a pool array XLA lays out column-major
        first, second = engine.kv_pool()
        engine.set_kv_pool([_column_major(first), second])
    ids = _TARGETS["runs"]
    with caplog.at_level("INFO", logger=host_copy.__name__):
        parked = dma.h2d(tier, _SLOTS, engine, ids, digest=True)  # type: ignore[arg-type]
    assert paths.took("xla")
    assert parked == integrity.checksum(tier, _SLOTS)
    assert (why in caplog.text) == dma.in_place  # the reason is logged; "off" is not news
    for array, original in zip(engine.kv_pool(), engine.original, strict=True):
        np.testing.assert_array_equal(np.asarray(array)[ids], original[_BLOCKS])
    if dma.in_place:  # XLA's write left the pool row-major: the next restore is in place
        dma.h2d(tier, _SLOTS, engine, ids)
        assert paths.took("in place")


def test_repeated_target_ids_go_through_xla(
    three_block_pieces: Callable[[PoolGeometry], int],
) -> None:
    engine = TwoArrayPool()
    three_block_pieces(engine.geometry)
    tier = DramTier(engine.geometry, 8 * engine.geometry.block_nbytes)
    paths = Paths()
    dma = HostCopyTransfer(copy_threads=2, observer=paths)
    dma.d2h(engine, [3, 4, 5, 6], tier, [0, 1, 2, 3])
    dma.h2d(tier, [0, 1, 2, 3], engine, [9, 10, 9, 11])  # two threads could race on block 9
    assert paths.took("xla")
    for array, original in zip(engine.kv_pool(), engine.original, strict=True):
        np.testing.assert_array_equal(np.asarray(array)[[10, 11]], original[[4, 6]])


def test_problem_names_what_is_not_a_plain_cpu_pool_array() -> None:
    engine = TwoArrayPool()
    geometry = engine.geometry
    first, second = engine.kv_pool()
    assert in_place.problem([first, second], geometry) is None
    assert "not a jax.Array" in (in_place.problem([np.asarray(first), second], geometry) or "")
    assert "twice" in (in_place.problem([first, first], geometry) or "")
    assert "expected float32" in (
        in_place.problem([first, second.view(jnp.uint32)], geometry) or ""
    )
    assert "row-major" in (in_place.problem([first, _column_major(second)], geometry) or "")
    pinned = jax.device_put(
        second, SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
    )
    assert "memory kind pinned_host" in (in_place.problem([first, pinned], geometry) or "")
    assert "2 pool arrays for 1" in (
        in_place.problem([first, second], PoolGeometry(24, 4, geometry.arrays[:1])) or ""
    )
    second.delete()
    assert "deleted" in (in_place.problem([first, second], geometry) or "")


# ---- nothing else sees the write ------------------------------------------------------------


@pytest.fixture
def engine() -> ReferenceEngine:
    return ReferenceEngine(ModelSpec(max_seq_len=256), PoolSpec(block_size=16, num_blocks=32))


def _parked(engine: ReferenceEngine) -> tuple[DramTier, list[int], np.ndarray]:
    """Random rows parked in slots 0..7 of a tier; the pool itself all zeros."""
    tier = DramTier(engine.geometry, 8 * engine.geometry.block_nbytes)
    (buf,) = tier.buffers()
    buf[...] = np.random.default_rng(11).integers(1, 2**16, size=buf.shape, dtype=np.uint16)
    return tier, tier.allocate("s", 8), buf.copy()


def _foreign_pool(engine: ReferenceEngine) -> tuple[jax.Array, np.ndarray]:
    """A pool array over memory numpy owns (page aligned, so JAX aliases it)."""
    nbytes = engine.geometry.total_bytes
    memory = np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint16)
    host = memory.reshape(engine.kv_pool()[0].shape)
    pool = jax.device_put(host, may_alias=True)
    assert pool.unsafe_buffer_pointer() == host.ctypes.data
    return pool, host


@pytest.mark.usefixtures("no_xla")
@pytest.mark.parametrize("alias", ["numpy view", "dlpack", "foreign memory"])
def test_what_else_holds_the_pool_buffer_keeps_its_bytes(
    engine: ReferenceEngine, alias: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An in-place restore never writes a buffer that anything but the pool holds: XLA's
    donated no-op copies it first, as XLA's own donated writes would."""
    tier, slots, rows = _parked(engine)
    other: np.ndarray | jax.Array
    if alias == "numpy view":
        other = np.asarray(engine.kv_pool()[0])
    elif alias == "dlpack":
        other = jax.dlpack.from_dlpack(engine.kv_pool()[0])
    else:
        pool, other = _foreign_pool(engine)
        engine.set_kv_pool([pool])
    before = _pointers(engine)
    ids = list(range(20, 28))
    with caplog.at_level("WARNING", logger=host_copy.__name__):
        HostCopyTransfer().h2d(tier, slots, engine, ids)
    np.testing.assert_array_equal(np.asarray(engine.kv_pool()[0])[ids], rows)
    assert _pointers(engine) != before  # written into a copy only the pool holds
    assert not np.asarray(other).any()  # the other holder still sees zeros
    assert "XLA copied the whole pool" in caplog.text


# The in-place restore's two fused copy loops: numpy's, and the native kernel's.
_SCATTERS = {"numpy": (numpy_loop, "scatter_rows"), "kernel": (native_loop, "copy_native")}


@pytest.mark.parametrize("copier", list(_SCATTERS))
def test_a_pool_replaced_during_the_write_fails_the_restore(
    engine: ReferenceEngine, monkeypatch: pytest.MonkeyPatch, copier: str
) -> None:
    """An engine that swaps its pool without its lock: the check after the copy refuses."""
    tier, slots, _rows = _parked(engine)
    module, name = _SCATTERS[copier]
    copy = getattr(module, name)

    def swap_then_copy(*args: object) -> list[bytes]:
        engine.set_kv_pool([jnp.zeros_like(engine.kv_pool()[0])])
        return copy(*args)  # type: ignore[no-any-return]

    monkeypatch.setattr(module, name, swap_then_copy)
    dma = HostCopyTransfer(native_copy=copier == "kernel")
    with pytest.raises(TransferError, match="replaced while the restore wrote"):
        dma.h2d(tier, slots, engine, list(range(8)))


@pytest.mark.parametrize("copier", list(_SCATTERS))
def test_a_failing_in_place_part_waits_for_the_other_thread(
    engine: ReferenceEngine, monkeypatch: pytest.MonkeyPatch, copier: str
) -> None:
    """The restore must not return (and let go of the lock) while a worker still writes."""
    tier, slots, _rows = _parked(engine)
    finished: list[int] = []
    raised, release = threading.Event(), threading.Event()
    threading.Thread(target=lambda: raised.wait(10) and release.set(), daemon=True).start()

    def scatter(*args: object) -> list[bytes]:
        if args[-2] == 0:  # the worker's part: held until this thread's part has raised
            assert release.wait(10)
            finished.append(0)
            return []
        raised.set()
        raise OSError("injected")

    monkeypatch.setattr(*_SCATTERS[copier], scatter)
    dma = HostCopyTransfer(copy_threads=2, native_copy=copier == "kernel")
    with pytest.raises(TransferError, match="injected"):
        dma.h2d(tier, slots, engine, list(range(8)))
    assert finished == [0]


# ---- decoding after an in-place restore ----------------------------------------------------


@pytest.fixture
def decode_engines() -> Iterator[tuple[ReferenceEngine, ReferenceEngine]]:
    spec = (ModelSpec(max_seq_len=256), PoolSpec(block_size=16, num_blocks=40))
    yield ReferenceEngine(*spec), ReferenceEngine(*spec)


@pytest.mark.parametrize(("threads", "allowed"), [(1, True), (2, True), (1, False)])
def test_decoding_after_a_restore_equals_decoding_without_a_pause(
    decode_engines: tuple[ReferenceEngine, ReferenceEngine], threads: int, allowed: bool
) -> None:
    engine, twin = decode_engines
    prompt = list(np.random.default_rng(2).integers(0, engine.vocab_size, 70))
    table, twin_table = [3, 9, 4, 17, 30], [0, 1, 2, 3, 4]
    engine.extend(table, 0, prompt)
    twin.extend(twin_table, 0, prompt)
    tier = DramTier(engine.geometry, 8 * engine.geometry.block_nbytes)
    slots = tier.allocate("s", len(table))
    paths = Paths()
    dma = HostCopyTransfer(
        chunk_bytes=2 * engine.geometry.block_nbytes, copy_threads=threads, observer=paths
    )
    dma.in_place = allowed
    parked = dma.d2h(engine, table, tier, slots, digest=True)
    engine.extend([5, 6, 7, 8, 10], 0, prompt[::-1])  # other work over the freed blocks
    restored = [12, 13, 14, 33, 2]  # other blocks than it left
    assert dma.h2d(tier, slots, engine, restored, digest=True) == parked
    assert paths.took("in place" if allowed else "xla")
    position = len(prompt)
    for token in (5, 77, 200):
        logits = engine.extend(restored, position, [token])
        twin_logits = twin.extend(twin_table, position, [token])
        assert logits.tobytes() == twin_logits.tobytes()
        position += 1
