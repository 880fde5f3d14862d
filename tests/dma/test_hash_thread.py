"""dma.hash_thread: the checksum hashed on a second thread while host_copy copies.

The copies must stay bit-exact and the checksum must be the fused path's (a copy parked
with one verifies with the other), for any copy_threads, chunking and slot order; a
damaged parked copy must still be caught on restore; the hash thread must let go of the
tier before a copy returns, also when the copy fails, and stop on close().
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from agentpark import integrity
from agentpark.blocks import PoolGeometry
from agentpark.config import Settings
from agentpark.dma import HostCopyTransfer
from agentpark.dma.host_copy import hash_thread, numpy_loop
from agentpark.tiers.dram import DramTier
from tests.dma.test_host_copy import _SLOTS, TwoArrayPool, _independent_checksum
from tests.harness import Daemon

HASH_THREAD = "agentpark-hash"
_BLOCKS = [5, 6, 7, 8, 0, 1, 23, 22, 9, 10, 11, 12, 13, 2, 3, 4, 14, 15, 16, 17]


@pytest.fixture
def three_block_pieces(monkeypatch: pytest.MonkeyPatch) -> Callable[[PoolGeometry], int]:
    """Pieces of 3 blocks, so copies cross many piece, span and chunk boundaries."""

    def use(geometry: PoolGeometry) -> int:
        monkeypatch.setattr(integrity, "PIECE_BYTES", 3 * geometry.block_nbytes)
        return 3

    return use


@pytest.fixture
def hashed_on() -> Iterator[list[str]]:
    """The names of the threads each piece digest was taken on."""
    names: list[str] = []
    original = hash_thread.piece_digest

    def recording(buf: np.ndarray, runs: integrity.Runs) -> bytes:
        names.append(threading.current_thread().name)
        return original(buf, runs)

    hash_thread.piece_digest = recording  # type: ignore[assignment]
    try:
        yield names
    finally:
        hash_thread.piece_digest = original  # type: ignore[assignment]


def _transfer(
    engine: TwoArrayPool, *, span_pieces: int, chunk_blocks: int = 64, threads: int = 1
) -> HostCopyTransfer:
    block = engine.geometry.block_nbytes
    dma = HostCopyTransfer(chunk_blocks * block + 5, threads, hash_thread=True)
    dma.hash_span_bytes = span_pieces * 3 * block
    return dma


def _hash_threads_alive() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(HASH_THREAD)]


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(("chunk_blocks", "span_pieces"), [(64, 1), (7, 1), (64, 2), (12, 3)])
def test_pause_and_restore_are_bit_exact_with_the_fused_checksum(
    three_block_pieces: Callable[[PoolGeometry], int],
    threads: int,
    chunk_blocks: int,
    span_pieces: int,
) -> None:
    engine = TwoArrayPool()
    k = three_block_pieces(engine.geometry)
    tier = DramTier(engine.geometry, 32 * engine.geometry.block_nbytes)
    fused = HostCopyTransfer().d2h(engine, _BLOCKS, tier, _SLOTS, digest=True)  # type: ignore[arg-type]
    tier.buffers()[0][...] = 0  # the overlapped pause below must write every byte again
    tier.buffers()[1][...] = 0
    dma = _transfer(engine, span_pieces=span_pieces, chunk_blocks=chunk_blocks, threads=threads)
    try:
        parked = dma.d2h(engine, _BLOCKS, tier, _SLOTS, digest=True)  # type: ignore[arg-type]
        for buf, original in zip(tier.buffers(), engine.original, strict=True):
            np.testing.assert_array_equal(buf[_SLOTS], original[_BLOCKS])
        assert parked == fused == _independent_checksum(tier, _SLOTS, k)

        targets = [(b + 3) % 24 for b in _BLOCKS]  # into other blocks
        restored = dma.h2d(tier, _SLOTS, engine, targets, digest=True)  # type: ignore[arg-type]
        assert restored == parked
        untouched = [b for b in range(24) if b not in targets]
        for array, original in zip(engine.kv_pool(), engine.original, strict=True):
            pool = np.asarray(array)
            np.testing.assert_array_equal(pool[targets], original[_BLOCKS])
            np.testing.assert_array_equal(pool[untouched], original[untouched])
    finally:
        dma.close()


def test_the_hash_thread_hashes_while_the_copier_goes_on(
    three_block_pieces: Callable[[PoolGeometry], int],
    monkeypatch: pytest.MonkeyPatch,
    hashed_on: list[str],
) -> None:
    """The copier's second span waits until the hash thread has hashed the first one:
    a path that hashed everything on the copying thread would fail here."""
    engine = TwoArrayPool()
    three_block_pieces(engine.geometry)
    tier = DramTier(engine.geometry, 32 * engine.geometry.block_nbytes)
    first_hashed = threading.Event()
    original_hash = hash_thread.HashJob._hash

    def hash_span(job: hash_thread.HashJob, lo: int, hi: int) -> None:
        original_hash(job, lo, hi)
        if threading.current_thread().name.startswith(HASH_THREAD):
            first_hashed.set()

    original_gather = numpy_loop.gather_rows

    def gather(*args: object) -> list[bytes]:
        if args[-2] != 0:  # not the first span
            assert first_hashed.wait(10)
        return original_gather(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(hash_thread.HashJob, "_hash", hash_span)
    monkeypatch.setattr(numpy_loop, "gather_rows", gather)
    dma = _transfer(engine, span_pieces=1)
    try:
        digest = dma.d2h(engine, _BLOCKS, tier, _SLOTS, digest=True)  # type: ignore[arg-type]
    finally:
        dma.close()
    assert digest == integrity.checksum(tier, _SLOTS)
    assert any(name.startswith(HASH_THREAD) for name in hashed_on)


def test_a_stalled_hash_thread_does_not_hold_the_copy_up(
    three_block_pieces: Callable[[PoolGeometry], int],
    monkeypatch: pytest.MonkeyPatch,
    hashed_on: list[str],
) -> None:
    """While the hash thread is stuck (a busy core), the copier hashes the spans itself."""
    engine = TwoArrayPool()
    three_block_pieces(engine.geometry)
    tier = DramTier(engine.geometry, 32 * engine.geometry.block_nbytes)
    stuck, finishing = threading.Event(), threading.Event()
    jobs: list[hash_thread.HashJob] = []
    original_hash, original_finish = hash_thread.HashJob._hash, hash_thread.HashJob.finish

    def hash_span(job: hash_thread.HashJob, lo: int, hi: int) -> None:
        if threading.current_thread().name.startswith(HASH_THREAD) and not stuck.is_set():
            stuck.set()
            assert finishing.wait(10)  # held until the copy has copied everything
        original_hash(job, lo, hi)

    def finish(job: hash_thread.HashJob) -> list[bytes]:
        jobs.append(job)
        finishing.set()
        return original_finish(job)

    monkeypatch.setattr(hash_thread.HashJob, "_hash", hash_span)
    monkeypatch.setattr(hash_thread.HashJob, "finish", finish)
    dma = _transfer(engine, span_pieces=1)
    try:
        digest = dma.d2h(engine, _BLOCKS, tier, _SLOTS, digest=True)  # type: ignore[arg-type]
    finally:
        dma.close()
    assert digest == integrity.checksum(tier, _SLOTS)
    assert jobs[0].hashed_here >= 1
    assert threading.current_thread().name in hashed_on


@pytest.mark.parametrize("threads", [1, 2])
def test_a_damaged_piece_is_caught_on_restore(
    three_block_pieces: Callable[[PoolGeometry], int], threads: int
) -> None:
    engine = TwoArrayPool()
    three_block_pieces(engine.geometry)
    tier = DramTier(engine.geometry, 32 * engine.geometry.block_nbytes)
    dma = _transfer(engine, span_pieces=1, threads=threads)
    try:
        parked = dma.d2h(engine, _BLOCKS, tier, _SLOTS, digest=True)  # type: ignore[arg-type]
        for piece in (0, 3, 6):  # first, middle and last (short) piece, one at a time
            slot = _SLOTS[piece * 3]
            tier.buffers()[piece % 2][slot].view(np.uint8).flat[5] ^= 0x04
            restored = dma.h2d(tier, _SLOTS, engine, _BLOCKS, digest=True)  # type: ignore[arg-type]
            assert restored is not None and restored != parked
            tier.buffers()[piece % 2][slot].view(np.uint8).flat[5] ^= 0x04
        restored = dma.h2d(tier, _SLOTS, engine, _BLOCKS, digest=True)  # type: ignore[arg-type]
        assert restored == parked
    finally:
        dma.close()


def test_a_failed_copy_waits_for_the_hash_thread_and_frees_it(
    three_block_pieces: Callable[[PoolGeometry], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = TwoArrayPool()
    three_block_pieces(engine.geometry)
    tier = DramTier(engine.geometry, 32 * engine.geometry.block_nbytes)
    original_gather = numpy_loop.gather_rows

    def gather(*args: object) -> list[bytes]:
        if args[-2] == 9:  # the fourth span
            raise OSError("injected")
        return original_gather(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(numpy_loop, "gather_rows", gather)
    dma = _transfer(engine, span_pieces=1)
    try:
        with pytest.raises(OSError, match="injected"):
            dma.d2h(engine, _BLOCKS, tier, _SLOTS, digest=True)  # type: ignore[arg-type]
        assert _hash_threads_alive()  # started, and idle now
        monkeypatch.setattr(numpy_loop, "gather_rows", original_gather)
        # Free again: the next copy gets the thread, and the right checksum.
        digest = dma.d2h(engine, _BLOCKS, tier, _SLOTS, digest=True)  # type: ignore[arg-type]
        assert digest == integrity.checksum(tier, _SLOTS)
    finally:
        dma.close()
    assert not _hash_threads_alive()


def test_an_error_on_the_hash_thread_fails_the_copy(
    three_block_pieces: Callable[[PoolGeometry], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = TwoArrayPool()
    three_block_pieces(engine.geometry)
    tier = DramTier(engine.geometry, 32 * engine.geometry.block_nbytes)
    failed = threading.Event()
    original_hash = hash_thread.HashJob._hash
    original_post = hash_thread.HashJob.post
    original_finish = hash_thread.HashJob.finish

    def hash_span(job: hash_thread.HashJob, lo: int, hi: int) -> None:
        if threading.current_thread().name.startswith(HASH_THREAD):
            failed.set()
            raise OSError("injected on the hash thread")
        original_hash(job, lo, hi)

    def post(job: hash_thread.HashJob, lo: int, hi: int) -> None:
        if lo == 0:  # the first span always goes to the thread
            job._queue.put((lo, hi))
        else:
            original_post(job, lo, hi)

    def finish(job: hash_thread.HashJob) -> list[bytes]:
        assert failed.wait(10)  # the thread has taken the first span (and failed on it)
        return original_finish(job)

    monkeypatch.setattr(hash_thread.HashJob, "_hash", hash_span)
    monkeypatch.setattr(hash_thread.HashJob, "post", post)
    monkeypatch.setattr(hash_thread.HashJob, "finish", finish)
    dma = _transfer(engine, span_pieces=1)
    try:
        with pytest.raises(OSError, match="injected on the hash thread"):
            dma.d2h(engine, _BLOCKS, tier, _SLOTS, digest=True)  # type: ignore[arg-type]
        job = dma.hasher.try_start(tier.buffers(), _SLOTS, 3)
        assert job is not None  # freed
        job.abandon()
    finally:
        dma.close()
    assert not _hash_threads_alive()


def test_small_copies_and_a_busy_thread_hash_on_the_copying_thread(
    three_block_pieces: Callable[[PoolGeometry], int], hashed_on: list[str]
) -> None:
    engine = TwoArrayPool()
    three_block_pieces(engine.geometry)
    tier = DramTier(engine.geometry, 32 * engine.geometry.block_nbytes)
    dma = _transfer(engine, span_pieces=3)  # 9 blocks a span
    try:
        small = [3, 4, 5, 6, 7, 8, 9, 10, 11]
        assert dma.d2h(engine, small, tier, small, digest=True) == integrity.checksum(tier, small)
        assert not dma.hasher.started  # one span: no thread, no hand-off
        held = dma.hasher.try_start(tier.buffers(), _SLOTS, 3)  # another copy has it
        assert held is not None
        try:
            digest = dma.d2h(engine, _BLOCKS, tier, _SLOTS, digest=True)  # type: ignore[arg-type]
            assert digest == integrity.checksum(tier, _SLOTS)
        finally:
            held.abandon()
        assert not hashed_on  # both hashed fused, in host_copy, not through a job
    finally:
        dma.close()


def test_a_flipped_byte_through_the_daemon_is_caught_with_the_hash_thread(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With dma.hash_thread on, end to end: each block's digest, a damaged one, a recompute."""
    from tests.test_tiers_e2e import FIRST, NEXT, PROMPT

    monkeypatch.setattr(integrity, "PIECE_BYTES", 1)  # a piece per block
    daemon = daemon_factory(make_settings(dma={"hash_thread": True}))
    transfer = daemon.runtime.driver.transfer
    assert isinstance(transfer, HostCopyTransfer) and transfer.hash_thread
    transfer.hash_span_bytes = 1  # a span per block: many spans
    c = daemon.client
    parking = daemon.runtime.parking
    c.post("/v1/sessions", json={"session_id": "s"})
    history = list(PROMPT.encode()) + c.post("/v1/sessions/s/generate", json=FIRST).json()["tokens"]
    assert c.post("/v1/sessions/s/pause", json={"tier": "shm"}).json()["tier"] == "shm"
    tier = parking.tiers["shm"]
    live = parking.live("default", "s")
    slots = live.slots
    assert len(slots) > 1
    row = c.get("/v1/sessions/s").json()
    # Blocks are stored by content, each with its digest (taken from the tier once the
    # copy landed): the hash thread is not on the pause path any more.
    assert live.digests == integrity.block_digests(tier, slots)
    assert row["state"] == "parked"
    assert c.post("/v1/sessions/s/resume").json()["restored_from"] == "shm"
    assert c.post("/v1/sessions/s/pause", json={"tier": "shm"}).json()["tier"] == "shm"
    slots = parking.live("default", "s").slots
    tier.buffers()[0][slots[-1]].view(np.uint8).flat[9] ^= 0x01
    assert c.post("/v1/sessions/s/resume").json()["restored_from"] == "recompute"
    out = c.post("/v1/sessions/s/generate", json=NEXT).json()
    c.post("/v1/sessions", json={"session_id": "ref"})
    ref = c.post("/v1/sessions/ref/generate", json={"prompt_tokens": history, **NEXT}).json()
    assert out["tokens"] == ref["tokens"] and out["logits"] == ref["logits"]
