"""A tier's slots as a store of blocks by content: sharing, sealing, caching, claiming."""

from __future__ import annotations

import pytest

from agentpark.blocks import PoolExhaustedError
from agentpark.tiers.slots import SlotStore

A, B, C, D = (("t", bytes([i]) * 32) for i in range(4))


def test_a_sealed_key_is_shared_and_freed_with_its_last_holder() -> None:
    store = SlotStore(4)
    first = store.reserve("s1", [A, B, None])
    assert first.fresh == [True, True, True] and first.to_copy == [0, 1, 2]
    # Not sealed yet: a second reservation of the same keys gets slots of its own.
    racing = store.reserve("s2", [A])
    assert racing.fresh == [True] and racing.slots[0] not in first.slots
    store.release("s2")
    store.seal("s1", dict.fromkeys(first.slots, "xxh3b:1"))
    second = store.reserve("s3", [A, B, C])
    assert second.slots[:2] == first.slots[:2] and second.fresh == [False, False, True]
    assert store.num_used == 4 and store.digest(first.slots[0]) == "xxh3b:1"
    store.release("s1")
    assert store.num_used == 3  # A and B live on in s3; s1's private block is free
    store.release("s3")
    assert store.num_used == 0 and store.num_free == 4 and store.find([A]) == []
    store.check_invariants()


def test_a_restored_copy_stays_findable_until_its_room_is_needed() -> None:
    store = SlotStore(3)
    res = store.reserve("s1", [A, B])
    store.seal("s1", {s: None for s in res.slots})
    store.release("s1", cache=True)
    assert store.num_used == 0 and store.num_cached == 2 and store.find([A, B, C]) == res.slots
    again = store.reserve("s1", [A, B, C])  # the next turn: only C is new
    assert again.fresh == [False, False, True] and store.num_cached == 0
    store.release("s1", cache=True)  # C was never sealed: freed, not cached
    # Room: cached blocks go oldest first, only when the whole reservation fits.
    with pytest.raises(PoolExhaustedError):
        store.reserve("big", [None] * 4)
    assert store.num_cached == 2  # a refused reservation evicted nothing
    store.reserve("big", [None, None])  # the free slot, then A (the oldest cached)
    assert store.num_cached == 1 and store.find([A]) == [] and store.find([B]) == [res.slots[1]]
    store.check_invariants()


def test_a_reservation_never_evicts_a_block_it_shares() -> None:
    store = SlotStore(2)
    res = store.reserve("s1", [A, B])
    store.seal("s1", {s: None for s in res.slots})
    store.release("s1", cache=True)
    with pytest.raises(PoolExhaustedError):
        store.reserve("s2", [A, C, D])  # C and D need the room B holds, and A is shared
    shared = store.reserve("s2", [A, C])
    assert shared.slots[0] == res.slots[0] and shared.fresh == [False, True]
    store.check_invariants()


def test_claims_rebuild_shared_blocks_and_keep_a_raced_duplicate_private() -> None:
    store = SlotStore(4)
    store.claim("s1", [0, 1], [A, B], ["d0", "d1"])
    store.claim("s2", [0, 2], [A, C], ["d0", "d2"])  # block A shared by both
    assert store.num_used == 3 and store.find([A, B]) == [0, 1]
    store.claim("s3", [3], [A], ["d0"])  # two parks of A raced: the second stays private
    assert store.find([A]) == [0]
    with pytest.raises(ValueError):
        store.claim("s4", [1], [C], ["d1"])  # slot 1 holds B, not C
    store.release("s1")
    assert store.find([A]) == [0]  # still s2's
    store.check_invariants()


def test_a_forgotten_block_is_never_handed_out_again() -> None:
    store = SlotStore(2)
    res = store.reserve("s1", [A])
    store.seal("s1", {res.slots[0]: "d"})
    store.forget(res.slots)
    assert store.find([A]) == [] and store.reserve("s2", [A]).fresh == [True]
    store.release("s1", cache=True)
    assert store.num_cached == 0  # unkeyed: freed, not cached
    store.check_invariants()


def test_a_hand_over_moves_every_reference_and_frees_nothing() -> None:
    store = SlotStore(6)
    held = store.reserve("s1", [A, B])
    store.seal("s1", {s: None for s in held.slots})
    # An import sharing A and B with s1, holding C twice, and a private block.
    res = store.reserve(("move", 1), [A, B, C, C, None])
    store.seal(("move", 1), {s: "xxh3b:2" for s in res.slots})
    store.hand_over(("move", 1), "s2")
    assert store.owned(("move", 1)) == [] and store.owned("s2") == res.slots
    assert store.release(("move", 1)) == []  # nothing is the import's any more
    store.check_invariants()
    store.release("s1")
    assert store.find([A, B, C]) == res.slots[:3]  # s2 holds them now
    # C twice, A and B shared once: every reference went over, so all go with s2.
    assert sorted(store.release("s2")) == sorted(set(res.slots))
    assert store.num_free == 6
    store.check_invariants()


def test_a_hand_over_of_pending_slots_makes_them_the_new_owners() -> None:
    store = SlotStore(2)
    res = store.reserve(("move", 1), [A, None])
    store.hand_over(("move", 1), "s1")
    store.seal("s1", {s: None for s in res.slots})  # what was pending is s1's to seal
    assert store.find([A]) == res.slots[:1]
    store.release("s1")
    assert store.num_free == 2
    store.check_invariants()
