"""host_copy's selector picks the copy loop from the settings; the observer hears every chunk.

The copies themselves are checked loop by loop in test_host_copy, test_in_place and
test_hash_thread; here, which loop the four flags and the arrays select, how a chunk is
cut into parts, and what an observer passed in is told.
"""

from __future__ import annotations

import numpy as np
import pytest

from agentpark import integrity
from agentpark.dma import HostCopyTransfer, native
from agentpark.dma.host_copy import CopySettings, NullObserver, RestorePath
from agentpark.dma.host_copy.hash_thread import PieceHasher, SpanLoop
from agentpark.dma.host_copy.native_loop import NativeLoop
from agentpark.dma.host_copy.numpy_loop import NumpyLoop
from agentpark.dma.host_copy.selector import hash_job, loop_name, pick_loop
from agentpark.dma.host_copy.settings import parts
from agentpark.tiers.dram import DramTier
from tests.dma.test_host_copy import _ODD_ROWS, TwoArrayPool


def _arrays(engine: TwoArrayPool) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A tier's buffers and views over the pool: a pause's destinations and sources."""
    tier = DramTier(engine.geometry, 8 * engine.geometry.block_nbytes)
    return tier.buffers(), [np.asarray(a) for a in engine.kv_pool()]


@pytest.mark.parametrize("digest", [False, True])
def test_the_kernel_is_picked_where_it_is_on_and_takes_the_rows(digest: bool) -> None:
    engine = TwoArrayPool()
    dsts, srcs = _arrays(engine)
    k = integrity.piece_blocks(engine.geometry)
    loop = pick_loop(CopySettings(), engine.geometry, digest, None, dsts, srcs)
    assert isinstance(loop, NativeLoop) and native.available() is not None
    assert loop.unit == (k if digest else 1)
    off = pick_loop(CopySettings(native_copy=False), engine.geometry, digest, None, dsts, srcs)
    assert isinstance(off, NumpyLoop) and off.unit == loop.unit


def test_rows_the_kernel_does_not_take_go_through_numpy() -> None:
    engine = TwoArrayPool(arrays=_ODD_ROWS)  # a row of 240 bytes: not whole 64-byte stripes
    dsts, srcs = _arrays(engine)
    assert isinstance(pick_loop(CopySettings(), engine.geometry, True, None, dsts, srcs), NumpyLoop)


def test_the_hash_thread_runs_a_checksummed_copy_of_more_than_one_span() -> None:
    engine = TwoArrayPool()
    geometry = engine.geometry
    dsts, srcs = _arrays(engine)
    settings = CopySettings(hash_thread=True, hash_span_bytes=2 * geometry.block_nbytes)
    span = settings.span_blocks(geometry)
    hasher = PieceHasher(2)
    try:
        assert hash_job(CopySettings(), hasher, geometry, dsts, list(range(8))) is None  # off
        assert hash_job(settings, hasher, geometry, dsts, list(range(span))) is None  # one span
        job = hash_job(settings, hasher, geometry, dsts, list(range(span + 1)))
        assert job is not None
        try:
            # The thread is taken: a second copy hashes fused.
            assert hash_job(settings, hasher, geometry, dsts, list(range(8))) is None
            loop = pick_loop(settings, geometry, True, job, dsts, srcs)
            assert isinstance(loop, SpanLoop) and loop.unit == span
        finally:
            job.abandon()
    finally:
        hasher.close()


def test_the_copy_loop_is_named_for_the_start_up_log() -> None:
    assert loop_name(CopySettings(native_copy=False)) == "numpy"
    assert loop_name(CopySettings(hash_thread=True)) == "numpy + hash thread"
    assert loop_name(CopySettings()) == f"native kernel, {native.available()}"


@pytest.mark.parametrize(
    ("lo", "hi", "unit", "count", "expected"),
    [
        (0, 10, 1, 1, [(0, 10)]),
        (0, 10, 3, 2, [(0, 6), (6, 10)]),  # whole units; the short one last
        (0, 4, 3, 5, [(0, 3), (3, 4)]),  # no more parts than units
        (6, 15, 3, 3, [(6, 9), (9, 12), (12, 15)]),
    ],
)
def test_a_chunk_is_cut_into_parts_of_whole_units(
    lo: int, hi: int, unit: int, count: int, expected: list[tuple[int, int]]
) -> None:
    assert parts(lo, hi, unit, count) == expected


class Recorder(NullObserver):
    def __init__(self) -> None:
        self.chunks: list[int] = []
        self.paths: list[RestorePath] = []

    def on_chunk(self, nbytes: int) -> None:
        self.chunks.append(nbytes)

    def on_restore_path(self, path: RestorePath) -> None:
        self.paths.append(path)


@pytest.mark.parametrize("in_place", [True, False])
def test_the_observer_hears_each_chunk_and_each_restore_path(
    in_place: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = TwoArrayPool()
    block = engine.geometry.block_nbytes
    monkeypatch.setattr(integrity, "PIECE_BYTES", block)
    tier = DramTier(engine.geometry, 16 * block)
    slots = tier.allocate("s", 10)
    seen = Recorder()
    # Chunks of 4 blocks (whole pieces of one block): 4 + 4 + 2.
    dma = HostCopyTransfer(chunk_bytes=4 * block, in_place=in_place, observer=seen)
    assert integrity.piece_blocks(engine.geometry) == 1
    dma.d2h(engine, list(range(10)), tier, slots, digest=True)
    assert seen.chunks == [4 * block, 4 * block, 2 * block]
    assert seen.paths == []  # a pause has no restore path
    dma.h2d(tier, slots, engine, list(range(12, 22)), digest=True)
    assert seen.chunks[3:] == [4 * block, 4 * block, 2 * block]
    assert seen.paths == ["in place" if in_place else "xla"] * 3


def test_the_default_observer_hears_nothing_and_another_can_be_passed_in_later() -> None:
    engine = TwoArrayPool()
    tier = DramTier(engine.geometry, 8 * engine.geometry.block_nbytes)
    dma = HostCopyTransfer()
    assert isinstance(dma.observer, NullObserver)
    dma.d2h(engine, [0, 1], tier, [0, 1])
    seen = Recorder()
    dma.observer = seen
    dma.h2d(tier, [0, 1], engine, [5, 6])
    assert seen.chunks == [2 * engine.geometry.block_nbytes] and seen.paths == ["in place"]
