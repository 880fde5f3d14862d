"""host_copy moves blocks bit-exact between a real JAX pool and a real tier buffer."""

from __future__ import annotations

import numpy as np
import pytest

from agentpark.blocks import contiguous_runs
from agentpark.dma import HostCopyTransfer
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
    HostCopyTransfer().warmup(engine, tier)
    np.testing.assert_array_equal(np.asarray(engine.kv_pool()[0]), original)
