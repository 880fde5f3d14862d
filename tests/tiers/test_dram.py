"""The DRAM tier: preallocated buffers, all-or-nothing slot allocation, clear errors."""

from __future__ import annotations

import pytest

from agentpark.blocks import ArraySpec, PoolGeometry
from agentpark.errors import TierFullError
from agentpark.tiers.dram import DramTier

GEOMETRY = PoolGeometry(
    num_blocks=8,
    block_size=16,
    arrays=(ArraySpec((2, 2, 16, 2, 16), "uint16"), ArraySpec((4,), "float32")),
)


def test_buffers_follow_the_pool_geometry_and_capacity_rounds_down() -> None:
    tier = DramTier(GEOMETRY, 5 * GEOMETRY.block_nbytes + 7)
    assert tier.capacity_blocks == 5
    shapes = [(b.shape, b.dtype.name) for b in tier.buffers()]
    assert shapes == [((5, 2, 2, 16, 2, 16), "uint16"), ((5, 4), "float32")]
    assert tier.capacity_bytes == 5 * GEOMETRY.block_nbytes


def test_allocation_is_all_or_nothing_and_names_the_numbers() -> None:
    tier = DramTier(GEOMETRY, 4 * GEOMETRY.block_nbytes)
    assert tier.allocate("a", 3) == [0, 1, 2]
    with pytest.raises(TierFullError) as info:
        tier.allocate("b", 2)
    assert info.value.details == {
        "tier": "dram",
        "needed_blocks": 2,
        "free_blocks": 1,
        "capacity_blocks": 4,
    }
    assert tier.used_blocks == 3
    assert tier.free("a") == [0, 1, 2]
    assert tier.used_blocks == 0 and tier.used_bytes == 0
    tier.check_invariants()


def test_zero_capacity_refuses_every_pause_but_not_an_empty_one() -> None:
    tier = DramTier(GEOMETRY, 0)
    assert tier.allocate("a", 0) == []
    with pytest.raises(TierFullError):
        tier.allocate("a", 1)
