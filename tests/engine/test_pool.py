"""BlockAllocator: bookkeeping stays consistent and failures allocate or free nothing."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from agentpark.blocks import BlockAllocator, PoolExhaustedError


def test_fresh_allocator_counts() -> None:
    alloc = BlockAllocator(8)
    assert (alloc.total, alloc.num_free, alloc.num_used) == (8, 8, 0)
    assert alloc.allocate("a", 3) == [0, 1, 2]
    assert (alloc.num_free, alloc.num_used) == (5, 3)
    assert alloc.allocate("a", 0) == []
    alloc.check_invariants()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_allocate_free_keeps_invariants(seed: int) -> None:
    rng = np.random.default_rng(seed)
    alloc = BlockAllocator(64)
    mirror: dict[tuple[str, int], list[int]] = {}
    owners = [("session", i) for i in range(6)]
    for _ in range(400):
        owner = owners[int(rng.integers(len(owners)))]
        op = int(rng.integers(3))
        if op == 0:
            n = int(rng.integers(0, 20))
            if n > alloc.num_free:
                with pytest.raises(PoolExhaustedError):
                    alloc.allocate(owner, n)
            else:
                got = alloc.allocate(owner, n)
                assert len(got) == n
                mirror.setdefault(owner, []).extend(got)
        elif op == 1 and mirror.get(owner):
            mine = mirror[owner]
            pick = sorted(
                rng.choice(len(mine), size=int(rng.integers(1, len(mine) + 1)), replace=False)
            )
            to_free = [mine[i] for i in pick]
            alloc.free(owner, to_free)
            mirror[owner] = [b for b in mine if b not in to_free]
        else:
            assert sorted(alloc.free_all(owner)) == sorted(mirror.pop(owner, []))
        alloc.check_invariants()
        for o in owners:
            assert alloc.owned(o) == mirror.get(o, [])
        assert alloc.num_used == sum(len(v) for v in mirror.values())
        assert alloc.num_free + alloc.num_used == alloc.total


def test_exhaustion_reports_numbers_and_allocates_nothing() -> None:
    alloc = BlockAllocator(10)
    first = alloc.allocate("a", 7)
    with pytest.raises(PoolExhaustedError) as info:
        alloc.allocate("b", 4)
    err = info.value
    assert (err.needed, err.free, err.total) == (4, 3, 10)
    assert isinstance(err, Exception)
    assert alloc.num_free == 3
    assert alloc.owned("b") == []
    assert alloc.owned("a") == first
    alloc.check_invariants()
    assert len(alloc.allocate("b", 3)) == 3  # exactly the rest still fits


def test_free_checks_ownership_and_is_all_or_nothing() -> None:
    alloc = BlockAllocator(6)
    a = alloc.allocate("a", 2)
    b = alloc.allocate("b", 2)
    with pytest.raises(ValueError, match="not owned"):
        alloc.free("a", [a[0], b[0]])
    with pytest.raises(ValueError, match="not owned"):
        alloc.free("a", [5])  # a free block
    with pytest.raises(ValueError, match="duplicate"):
        alloc.free("a", [a[0], a[0]])
    assert alloc.owned("a") == a
    assert alloc.num_free == 2
    alloc.free("a", [a[1]])
    assert alloc.owned("a") == [a[0]]
    assert alloc.free_all("a") == [a[0]]
    assert alloc.free_all("a") == []
    assert alloc.owned("b") == b
    alloc.check_invariants()


def test_freed_blocks_are_reused() -> None:
    alloc = BlockAllocator(4)
    alloc.allocate("a", 4)
    alloc.free("a", [2, 0])
    assert sorted(alloc.allocate("b", 2)) == [0, 2]


def test_bad_sizes() -> None:
    with pytest.raises(ValueError):
        BlockAllocator(0)
    with pytest.raises(ValueError):
        BlockAllocator(4).allocate("a", -1)


def test_check_invariants_detects_corruption() -> None:
    alloc = BlockAllocator(4)
    alloc.allocate("a", 2)
    alloc._free.append(alloc._free[0])  # a duplicate in the free list
    with pytest.raises(AssertionError, match="duplicate"):
        alloc.check_invariants()

    alloc = BlockAllocator(4)
    blocks = alloc.allocate("a", 2)
    alloc._free.append(blocks[0])  # free and owned at once (and counts no longer add up)
    with pytest.raises(AssertionError):
        alloc.check_invariants()


def test_concurrent_allocate_free() -> None:
    alloc = BlockAllocator(256)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for _ in range(300):
                blocks = alloc.allocate(("t", i), 8)
                assert alloc.owned(("t", i)) == blocks
                alloc.free(("t", i), blocks)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    alloc.check_invariants()
    assert alloc.num_free == 256


def test_claim_takes_exactly_the_named_free_blocks() -> None:
    alloc = BlockAllocator(8)
    alloc.claim("a", [5, 2])
    assert alloc.owned("a") == [5, 2] and alloc.num_free == 6
    with pytest.raises(ValueError, match="not free"):
        alloc.claim("b", [1, 2])
    with pytest.raises(ValueError, match="not free"):
        alloc.claim("b", [8])
    assert alloc.owned("b") == [] and alloc.num_free == 6
    assert 2 not in alloc.allocate("c", 6)
    alloc.check_invariants()
