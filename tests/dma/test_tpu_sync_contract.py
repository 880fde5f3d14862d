"""tpu_sync against a recording stand-in: only what the real library cannot exercise.

TPU Sync's real wheel is tested in tests/dma/tpu_real (run by `make test` in .venv-tpu,
Python 3.12): round trips, the exact d2h/h2d calls, bad offsets, the daemon, kill -9 warm
boot. This file runs in the main suite (Python 3.11, no tpu_sync) and keeps what needs a
manager whose behaviour can be scripted: a future whose ``wait()`` fails (a DMA time-out,
an HBM ECC error: the real library on CPU never fails a valid copy), a call that raises
something unexpected, what a failed pause or restore leaves behind and that a retry works,
a pool that moved after binding, the tier/engine aliasing checks, and that ``tpu_sync`` is
imported only when a manager is built. The stand-in takes the real constructor's inputs and
answers ``d2h``/``h2d(src_offsets, dst_offsets, copy_sizes)`` with a future whose ``wait()``
does the copy (the real one copies at dispatch; nothing here depends on that).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentpark.blocks import paired_runs
from agentpark.dma import HostCopyTransfer
from agentpark.dma.tpu_sync import TpuSyncTransfer, default_manager_factory
from agentpark.engine.reference import ModelSpec, PoolSpec, ReferenceEngine
from agentpark.errors import TransferError
from agentpark.tiers.base import SlotTier
from agentpark.tiers.dram import DramTier

NUM_BLOCKS = 32
HOST_BLOCKS = 16


def _raw_view(arr: jax.Array) -> np.ndarray:
    """A writable numpy view of the memory behind a (CPU) JAX array, as a DMA engine sees it."""
    arr.block_until_ready()
    raw = (ctypes.c_byte * arr.nbytes).from_address(arr.unsafe_buffer_pointer())
    return np.frombuffer(raw, dtype=arr.dtype).reshape(arr.shape)


class RecordingFuture:
    """Like TPU Sync's RaidenFuture: ``wait()`` blocks, raising RuntimeError on failure."""

    def __init__(self, copy: Callable[[], None], error: str | None) -> None:
        self._copy = copy
        self._error = error
        self.waits = 0
        self.done = False

    def wait(self) -> None:
        self.waits += 1
        if self._error is not None:
            raise RuntimeError(f"Async copy failed: {self._error}")
        if not self.done:
            self._copy()
            self.done = True

    def is_ready(self) -> bool:
        return self.done


class RecordingKVCacheManagerStandIn:
    """A stand-in for TPU Sync's KVCacheManager, for hardware we do not have (a TPU).

    It mirrors ``tpu_sync.api.jax.kv_cache_manager.KVCacheManager`` (google/tpu-sync):
    built over the pool arrays with ``host_blocks_to_allocate`` host blocks; ``d2h`` and
    ``h2d(src_offsets, dst_offsets, copy_sizes)`` copy ``copy_sizes[i]`` whole blocks (axis 0
    of every array) and return a future. Like the real one it keeps the arrays it was given
    and copies to and from THEIR memory (here a raw view of the CPU buffer) behind XLA's back;
    its host blocks are a numpy array (the real ones are pinned, in the TPU's tiled layout).

    Every call is recorded; ``fail_next_wait`` makes the next future's ``wait()`` raise
    RuntimeError without copying, ``raise_on_next_call`` makes the next call itself raise.
    """

    def __init__(self, kv_caches: list[jax.Array], host_blocks: int) -> None:
        self.kv_caches = list(kv_caches)
        self.host_blocks = host_blocks
        self.device = [_raw_view(arr) for arr in self.kv_caches]
        self.host = [np.zeros((host_blocks, *arr.shape[1:]), arr.dtype) for arr in kv_caches]
        self.calls: list[tuple[str, list[int], list[int], list[int]]] = []
        self.futures: list[RecordingFuture] = []
        self.fail_next_wait: str | None = None
        self.raise_on_next_call: Exception | None = None

    def d2h(
        self, src_offsets: list[int], dst_offsets: list[int], copy_sizes: list[int] | None = None
    ) -> RecordingFuture:
        return self._issue("d2h", src_offsets, dst_offsets, copy_sizes, self.device, self.host)

    def h2d(
        self, src_offsets: list[int], dst_offsets: list[int], copy_sizes: list[int] | None = None
    ) -> RecordingFuture:
        return self._issue("h2d", src_offsets, dst_offsets, copy_sizes, self.host, self.device)

    def _issue(
        self,
        direction: str,
        src: list[int],
        dst: list[int],
        sizes: list[int] | None,
        sources: list[np.ndarray],
        destinations: list[np.ndarray],
    ) -> RecordingFuture:
        sizes = [1] * len(src) if sizes is None else sizes
        self.calls.append((direction, list(src), list(dst), list(sizes)))
        if self.raise_on_next_call is not None:
            exc, self.raise_on_next_call = self.raise_on_next_call, None
            raise exc
        if not len(src) == len(dst) == len(sizes):
            raise ValueError("src, dst and copy sizes must have the same length")
        for s, d, n in zip(src, dst, sizes, strict=True):
            assert n >= 1
            assert s >= 0 and s + n <= len(sources[0]), (direction, s, n)
            assert d >= 0 and d + n <= len(destinations[0]), (direction, d, n)

        def copy() -> None:
            for source, destination in zip(sources, destinations, strict=True):
                for s, d, n in zip(src, dst, sizes, strict=True):
                    destination[d : d + n] = source[s : s + n]

        future = RecordingFuture(copy, self.fail_next_wait)
        self.fail_next_wait = None
        self.futures.append(future)
        return future


class SlotOnlyTier(SlotTier):
    """A tier that keeps slot bookkeeping only (no buffers() at all), as tpu_sync needs."""

    name = "dram"


@pytest.fixture
def engine() -> ReferenceEngine:
    return ReferenceEngine(
        ModelSpec(max_seq_len=256), PoolSpec(block_size=16, num_blocks=NUM_BLOCKS)
    )


@pytest.fixture
def original(engine: ReferenceEngine) -> np.ndarray:
    """Random bytes in every block of the pool (written by host_copy's donated scatter)."""
    rng = np.random.default_rng(5)
    scratch = DramTier(engine.geometry, engine.geometry.total_bytes)
    (buf,) = scratch.buffers()
    buf[...] = rng.integers(0, 2**16, size=buf.shape, dtype=np.uint16)
    HostCopyTransfer().h2d(scratch, scratch.allocate("fill", NUM_BLOCKS), engine, list(range(32)))
    return buf.copy()


class Setup:
    def __init__(self, engine: ReferenceEngine) -> None:
        self.built: list[tuple[list[jax.Array], int]] = []
        self.managers: list[RecordingKVCacheManagerStandIn] = []
        self.transfer = TpuSyncTransfer(engine, HOST_BLOCKS, manager_factory=self.factory)
        self.tier = SlotOnlyTier(engine.geometry, HOST_BLOCKS)

    def factory(self, kv_caches: list[jax.Array], host_blocks: int) -> Any:
        self.built.append((kv_caches, host_blocks))
        self.managers.append(RecordingKVCacheManagerStandIn(kv_caches, host_blocks))
        return self.managers[-1]

    @property
    def manager(self) -> RecordingKVCacheManagerStandIn:
        (manager,) = self.managers
        return manager


@pytest.fixture
def setup(engine: ReferenceEngine) -> Setup:
    return Setup(engine)


def _pool(engine: ReferenceEngine) -> np.ndarray:
    return np.asarray(engine.kv_pool()[0]).copy()


def test_paired_runs_merge_only_where_both_sides_are_consecutive() -> None:
    assert paired_runs([], []) == ([], [], [])
    assert paired_runs([7], [0]) == ([7], [0], [1])
    assert paired_runs([9, 10, 11, 2, 5, 6, 20], [3, 4, 5, 6, 7, 8, 9]) == (
        [9, 2, 5, 20],
        [3, 6, 7, 9],
        [3, 1, 2, 1],
    )
    assert paired_runs([4, 5], [0, 2]) == ([4, 5], [0, 2], [1, 1])  # source runs, dest not
    assert paired_runs([4, 6], [0, 1]) == ([4, 6], [0, 1], [1, 1])  # dest runs, source not
    assert paired_runs([3, 2, 1], [0, 1, 2]) == ([3, 2, 1], [0, 1, 2], [1, 1, 1])  # descending
    with pytest.raises(ValueError, match="2 sources but 1 destinations"):
        paired_runs([1, 2], [0])


def test_manager_is_built_once_over_the_pool_with_the_tier_capacity(
    engine: ReferenceEngine, setup: Setup
) -> None:
    assert not setup.transfer.bound
    assert setup.built == []  # nothing is built (nor tpu_sync imported) until it is needed
    setup.transfer.start()
    setup.transfer.start()
    assert setup.transfer.bound
    ((kv_caches, host_blocks),) = setup.built
    assert host_blocks == HOST_BLOCKS
    assert len(kv_caches) == 1
    assert kv_caches[0] is engine.kv_pool()[0]
    assert setup.transfer.bytes_in_tier is False


def test_a_failed_pause_raises_transfer_error_and_leaves_everything(
    engine: ReferenceEngine, original: np.ndarray, setup: Setup
) -> None:
    slots = setup.tier.allocate("s", 3)
    setup.transfer.start()
    manager = setup.manager
    manager.fail_next_wait = "DMA timeout on chip 0"
    with pytest.raises(TransferError) as info:
        setup.transfer.d2h(engine, [4, 5, 6], setup.tier, slots)
    assert info.value.message == (
        "TPU Sync pause (d2h) of 3 blocks in 1 runs failed: Async copy failed: DMA timeout on "
        "chip 0"
    )
    assert manager.futures[0].waits == 1  # the failure came from wait(), as TPU Sync's does
    assert (manager.host[0] == 0).all()
    assert setup.tier.used_blocks == 3
    assert setup.tier.free("s") == slots  # still the caller's, nothing freed
    np.testing.assert_array_equal(_pool(engine), original)


def test_a_failed_restore_keeps_the_parked_copy_and_a_retry_works(
    engine: ReferenceEngine, original: np.ndarray, setup: Setup
) -> None:
    slots = setup.tier.allocate("s", 3)
    setup.transfer.d2h(engine, [4, 5, 6], setup.tier, slots)
    manager = setup.manager
    parked = manager.host[0].copy()

    manager.fail_next_wait = "HBM ECC error"
    with pytest.raises(TransferError, match=r"restore \(h2d\) of 3 blocks .*HBM ECC error"):
        setup.transfer.h2d(setup.tier, slots, engine, [10, 11, 12])
    np.testing.assert_array_equal(manager.host[0], parked)
    np.testing.assert_array_equal(_pool(engine), original)
    assert setup.tier.used_blocks == 3

    setup.transfer.h2d(setup.tier, slots, engine, [10, 11, 12])  # the retry
    np.testing.assert_array_equal(_pool(engine)[[10, 11, 12]], original[[4, 5, 6]])


def test_a_call_that_raises_is_a_transfer_error(engine: ReferenceEngine, setup: Setup) -> None:
    slots = setup.tier.allocate("s", 2)
    setup.transfer.start()
    setup.manager.raise_on_next_call = ValueError("INVALID_ARGUMENT: negative offset")
    with pytest.raises(TransferError, match="INVALID_ARGUMENT: negative offset"):
        setup.transfer.d2h(engine, [1, 2], setup.tier, slots)
    assert setup.manager.futures == []


def test_a_pool_that_moved_is_refused_before_any_copy(
    engine: ReferenceEngine, original: np.ndarray, setup: Setup
) -> None:
    slots = setup.tier.allocate("s", 2)
    setup.transfer.d2h(engine, [1, 2], setup.tier, slots)
    moved = jnp.array(engine.kv_pool()[0], copy=True)  # a new buffer, not updated in place
    engine.set_kv_pool([moved])
    with pytest.raises(TransferError, match="pool arrays moved in device memory"):
        setup.transfer.h2d(setup.tier, slots, engine, [8, 9])
    assert len(setup.manager.calls) == 1
    np.testing.assert_array_equal(_pool(engine), original)


def test_wrong_engine_tier_or_slots_are_refused_without_a_call(
    engine: ReferenceEngine, setup: Setup
) -> None:
    transfer = setup.transfer
    with pytest.raises(ValueError, match="2 block ids but 1 slots"):
        transfer.d2h(engine, [0, 1], setup.tier, [0])
    too_big = SlotOnlyTier(engine.geometry, HOST_BLOCKS + 1)
    with pytest.raises(ValueError, match="17 slots but TPU Sync holds 16 host blocks"):
        transfer.d2h(engine, [0], too_big, [0])
    transfer.d2h(engine, [0], setup.tier, [0])
    with pytest.raises(ValueError, match="the dram tier's slots would alias"):
        transfer.d2h(engine, [0], SlotOnlyTier(engine.geometry, 4), [0])
    other = ReferenceEngine(ModelSpec(max_seq_len=256), PoolSpec(block_size=16, num_blocks=8))
    with pytest.raises(ValueError, match="bound to another engine"):
        transfer.h2d(setup.tier, [0], other, [0])
    with pytest.raises(ValueError, match=r"tier slots \[16\] out of range 0..15"):
        transfer.d2h(engine, [0], setup.tier, [HOST_BLOCKS])
    with pytest.raises(ValueError, match=r"block ids \[32\] out of range 0..31"):
        transfer.h2d(setup.tier, [0], engine, [NUM_BLOCKS])
    transfer.h2d(setup.tier, [], engine, [])  # nothing to do: no call
    assert [call[0] for call in setup.manager.calls] == ["d2h"]
    with pytest.raises(ValueError, match="host_blocks must be positive"):
        TpuSyncTransfer(engine, 0)


def test_the_real_manager_is_imported_only_when_built(
    engine: ReferenceEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    transfer = TpuSyncTransfer(engine, HOST_BLOCKS)  # default factory: no import yet
    with pytest.raises(TransferError, match=r"cannot start TPU Sync's KVCacheManager: .*tpu_sync"):
        transfer.start()
    monkeypatch.setenv("RAIDEN_SHM_KEY", "raiden_cache")
    with pytest.raises(TransferError, match="RAIDEN_SHM_KEY is set"):
        default_manager_factory()(engine.kv_pool(), HOST_BLOCKS)
