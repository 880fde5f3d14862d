"""The mover's checksummed copies: fused into host_copy, verified as a restore copies."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash

from agentpark import integrity
from agentpark.dma import HostCopyTransfer
from agentpark.dma.host_copy import LastRestorePath
from agentpark.engine.reference import ModelSpec, PoolSpec, ReferenceEngine
from agentpark.parking.mover import EnginePool, Mover
from agentpark.tiers.dram import DramTier


@pytest.fixture(params=[(1, True), (2, True), (1, False)], ids=["in-place", "in-place-x2", "xla"])
def setup(request: pytest.FixtureRequest) -> tuple[ReferenceEngine, DramTier, Mover, np.ndarray]:
    """host_copy with 1 or 2 copy threads, restoring in place or through XLA."""
    threads, in_place = request.param
    engine = ReferenceEngine(ModelSpec(max_seq_len=256), PoolSpec(block_size=16, num_blocks=32))
    scratch = DramTier(engine.geometry, engine.geometry.total_bytes)
    (buf,) = scratch.buffers()
    buf[...] = np.random.default_rng(5).integers(0, 2**16, size=buf.shape, dtype=np.uint16)
    dma = HostCopyTransfer(copy_threads=threads, in_place=in_place, observer=LastRestorePath())
    dma.h2d(scratch, list(range(32)), engine, list(range(32)))
    tier = DramTier(engine.geometry, 16 * engine.geometry.block_nbytes)
    mover = Mover(engine.geometry, [tier], dma, frozenset({"dram"}))
    return engine, tier, mover, buf.copy()


def _park(engine: ReferenceEngine, tier: DramTier, mover: Mover) -> tuple[list[int], str]:
    slots = [7, 8, 9, 2, 3]
    fused = mover.copy(EnginePool(engine), [4, 5, 6, 20, 21], tier, slots, hash=True)
    assert fused is not None and fused == integrity.checksum(tier, slots)
    return slots, fused


def test_a_restore_verifies_as_it_copies(
    setup: tuple[ReferenceEngine, DramTier, Mover, np.ndarray],
) -> None:
    engine, tier, mover, original = setup
    slots, digest = _park(engine, tier, mover)
    assert mover.restore(tier, slots, slots, EnginePool(engine), [10, 11, 12, 13, 14], digest)
    pool = np.asarray(engine.kv_pool()[0])
    np.testing.assert_array_equal(pool[10:15], original[[4, 5, 6, 20, 21]])


def test_a_flipped_byte_fails_the_restore_whole_or_prefix(
    setup: tuple[ReferenceEngine, DramTier, Mover, np.ndarray],
) -> None:
    engine, tier, mover, _original = setup
    slots, digest = _park(engine, tier, mover)
    tier.buffers()[0][3].view(np.uint8).flat[11] ^= 4  # the last parked block
    assert not mover.restore(tier, slots, slots, EnginePool(engine), [10, 11, 12, 13, 14], digest)
    assert isinstance(mover.transfer, HostCopyTransfer)
    seen = mover.transfer.observer
    assert isinstance(seen, LastRestorePath)
    assert seen.last == ("in place" if mover.transfer.in_place else "xla")
    # A prefix restore cannot hash the whole copy as it goes: it verifies first.
    assert not mover.restore(tier, slots[:2], slots, EnginePool(engine), [10, 11], digest)


def test_copies_parked_under_the_old_checksum_still_restore_and_move(
    setup: tuple[ReferenceEngine, DramTier, Mover, np.ndarray],
) -> None:
    engine, tier, mover, original = setup
    slots, _digest = _park(engine, tier, mover)
    (buf,) = tier.buffers()
    legacy = f"xxh3:{xxhash.xxh3_64_hexdigest(buf[slots].tobytes())}"
    assert mover.restore(tier, slots, slots, EnginePool(engine), [10, 11, 12, 13, 14], legacy)
    np.testing.assert_array_equal(
        np.asarray(engine.kv_pool()[0])[10:15], original[[4, 5, 6, 20, 21]]
    )
    assert mover.intact(tier, slots, legacy)  # a move checks an old copy at its source
    buf[slots[0]].view(np.uint8).flat[0] ^= 1
    assert not mover.intact(tier, slots, legacy)
    assert not mover.restore(tier, slots, slots, EnginePool(engine), [10, 11, 12, 13, 14], legacy)
