"""The session core driven through the external-driver interface by a scripted fake engine.

``FakeEngine`` is a stand-in for a serving engine in another process (vLLM): it owns a
pool of numpy arrays and its own block allocator, writes KV bytes for the tokens it
"computes", frees blocks when a request ends and reuses them for others. The core, the
tiers (a real dram tier and a real /dev/shm file), the SQLite store and the checksums are
the real ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from agentpark.blocks import ArraySpec, BlockAllocator, PoolGeometry
from agentpark.enums import Decision, Reason, RestoredFrom, State
from agentpark.errors import InvalidStateError
from agentpark.integrity import block_digests
from agentpark.parking import (
    ArrayPool,
    CoreOptions,
    EngineHost,
    ExternalManager,
    PauseAdvice,
    external_core,
)
from agentpark.parking.external import (
    BlocksRemoved,
    BlocksStored,
    LoadPlan,
    StorePlan,
    park_turn,
    restore_prefix,
)
from agentpark.store.db import open_database
from agentpark.store.migrate import upgrade
from agentpark.store.repository import SessionStore
from agentpark.tiers.base import HostTier
from agentpark.tiers.dram import DramTier
from agentpark.tiers.shm import ShmTier

BLOCK = 4  # tokens per block
GEOMETRY = PoolGeometry(
    num_blocks=16,
    block_size=BLOCK,
    arrays=(ArraySpec((2, BLOCK, 8), "uint16"), ArraySpec((BLOCK, 3), "float32")),
)
TENANT = "t"


class FakeEngine:
    """FAKE serving engine: a numpy pool, its allocator, and KV bytes made from token ids."""

    def __init__(self, geometry: PoolGeometry) -> None:
        self.arrays = tuple(
            np.zeros((geometry.num_blocks, *a.block_shape), dtype=a.dtype) for a in geometry.arrays
        )
        self.pool = ArrayPool(self.arrays)
        self.allocator = BlockAllocator(geometry.num_blocks)

    def compute(self, request: str, tokens: list[int], rng: np.random.Generator) -> list[int]:
        """Allocate blocks for ``tokens`` and write (random, seeded) KV into them."""
        blocks = self.allocator.allocate(request, GEOMETRY.blocks_for(len(tokens)))
        for arr in self.arrays:
            for b in blocks:
                arr[b] = rng.integers(0, 60_000, arr.shape[1:]).astype(arr.dtype)
        return blocks

    def rows(self, blocks: list[int]) -> list[np.ndarray]:
        return [arr[blocks].copy() for arr in self.arrays]

    def finish(self, request: str) -> None:
        """The request ended: its blocks go back to the free list, and get scribbled on."""
        for b in self.allocator.free_all(request):
            for arr in self.arrays:
                arr[b] = 0


@dataclass
class Host:
    store: SessionStore
    tiers: list[HostTier]
    shm_path: Path
    engine: FakeEngine
    driver: ExternalManager

    def restart(self) -> None:
        """A restart of the daemon: a new core over the same SQLite file and shm file."""
        self.driver.core.close()
        for tier in self.tiers:
            tier.close()
        self.tiers = _tiers(self.shm_path)
        self.driver = _core(self.store, self.tiers, self.engine)


def _tiers(shm_path: Path) -> list[HostTier]:
    capacity = 8 * GEOMETRY.block_nbytes
    return [
        DramTier(GEOMETRY, capacity),
        ShmTier(shm_path, GEOMETRY, capacity, "fake-model"),
    ]


def _core(store: SessionStore, tiers: list[HostTier], engine: FakeEngine) -> ExternalManager:
    options = CoreOptions(checksum_tiers=frozenset({"shm"}))
    return external_core(store, GEOMETRY, "fake-model", tiers, pool=engine.pool, options=options)


@pytest.fixture
def host(tmp_path: Path, shm_dir: Path) -> Iterator[Host]:
    url = f"sqlite:///{tmp_path / 'agentpark.db'}"
    upgrade(url)
    store = SessionStore(*open_database(url))
    engine = FakeEngine(GEOMETRY)
    tiers = _tiers(shm_dir / "tier")
    made = Host(store, tiers, shm_dir / "tier", engine, _core(store, tiers, engine))
    yield made
    made.driver.core.close()
    for tier in made.tiers:
        tier.close()
    store.close()


def _kinds(host: Host, session_id: str) -> list[str]:
    return [e.kind for e in reversed(host.store.events(TENANT, session_id, 100))]


def test_a_parked_turn_is_restored_into_other_blocks_with_identical_bytes(host: Host) -> None:
    engine, driver, rng = host.engine, host.driver, np.random.default_rng(0)
    engine.compute("someone-else", [1, 2, 3, 4, 5], rng)  # so the session's ids are not 0..
    turn1 = [7, 3, 9, 1, 4, 4, 8, 2, 6, 5]  # 10 tokens: 2 whole blocks and a partial one
    blocks1 = engine.compute("req-1", turn1, rng)
    kept_rows = engine.rows(blocks1)

    result = park_turn(driver, TENANT, "agent-1", turn1, blocks1, tool="web_search")
    assert result.decision == "parked" and result.row.state == State.PARKED
    assert result.row.tier == "dram" and result.row.kv_blocks == 3
    engine.finish("req-1")  # the engine frees the blocks only after turn_ended returned
    engine.finish("someone-else")
    assert host.tiers[0].used_blocks == 3
    driver.core.check_invariants()

    # Turn 2 replays turn 1 and appends the tool's result.
    turn2 = [*turn1, 11, 12, 13, 14, 15, 16]
    assert driver.lookup(TENANT, "agent-1", turn2) == 8  # whole blocks only
    blocks2 = engine.allocator.allocate("req-2", GEOMETRY.blocks_for(len(turn2)))
    assert not set(blocks2[:2]) & set(blocks1[:2]), "the engine must hand out other blocks"
    restored = restore_prefix(driver, TENANT, "agent-1", turn2, blocks2)

    assert restored.tokens == 8 and restored.restored_from == RestoredFrom.DRAM
    for now, before in zip(engine.rows(blocks2[:2]), kept_rows, strict=True):
        assert np.array_equal(now, before[:2])  # bit-identical, every pool array
    row = driver.core.get(TENANT, "agent-1")
    assert row.state == State.ACTIVE and row.num_tokens == 8 and row.tier is None
    assert host.tiers[0].used_blocks == 0
    assert driver.core.counters.prefill_tokens_avoided == 8
    assert _kinds(host, "agent-1") == ["create", "turn", "pause", "resume", "tool_return"]
    driver.core.check_invariants()


def test_lookup_stops_at_the_first_differing_token_and_leaves_one_to_compute(
    host: Host,
) -> None:
    engine, driver, rng = host.engine, host.driver, np.random.default_rng(1)
    tokens = list(range(100, 112))  # exactly 3 blocks
    park_turn(driver, TENANT, "s", tokens, engine.compute("r", tokens, rng))
    engine.finish("r")
    assert driver.lookup(TENANT, "s", tokens) == 8  # the same 12 tokens: one must be computed
    assert driver.lookup(TENANT, "s", [*tokens, 1]) == 12
    changed = [*tokens[:5], 999, *tokens[6:], 1]
    assert driver.lookup(TENANT, "s", changed) == 4  # differs in block 2
    assert driver.lookup(TENANT, "s", [5, *tokens]) == 0
    # Another session with the same tokens is given the blocks by content; never another
    # tenant's, and never a request whose tokens differ in the first block.
    assert driver.lookup(TENANT, "unknown", tokens) == 8
    assert driver.lookup(TENANT, None, tokens) == 8
    assert driver.lookup("other-tenant", "s", tokens) == 0
    assert driver.lookup("other-tenant", "s", tokens) == 0


def test_a_short_pause_is_kept_and_nothing_is_parked(host: Host) -> None:
    engine, driver, rng = host.engine, host.driver, np.random.default_rng(2)
    driver.core.advisor = lambda kv_bytes, tool, expected: PauseAdvice(False, "short", 0.5)
    tokens = list(range(9))
    result = park_turn(driver, TENANT, "s", tokens, engine.compute("r", tokens, rng), tool="calc")
    assert result.decision == "kept" and result.why == "short"
    assert result.row.state == State.ACTIVE and all(t.used_blocks == 0 for t in host.tiers)
    assert driver.lookup(TENANT, "s", [*tokens, 1]) == 0  # the engine's own cache has it
    assert _kinds(host, "s") == ["create", "turn", "keep"]


def test_a_corrupt_parked_copy_restores_nothing_and_the_next_turn_recomputes(
    host: Host,
) -> None:
    engine, driver, rng = host.engine, host.driver, np.random.default_rng(3)
    tokens = list(range(9))
    blocks = engine.compute("r", tokens, rng)
    result = park_turn(driver, TENANT, "s", tokens, blocks, tier="shm")
    engine.finish("r")
    assert result.row.tier == "shm" and result.row.checksum
    slot = driver.core.live(TENANT, "s").slots[1]
    host.tiers[1].buffers()[0][slot].flat[3] ^= 1  # one flipped bit in the parked copy

    turn2 = [*tokens, 50, 51]
    blocks2 = engine.allocator.allocate("r2", GEOMETRY.blocks_for(len(turn2)))
    restored = restore_prefix(driver, TENANT, "s", turn2, blocks2)
    assert restored.tokens == 0 and restored.restored_from is None
    row = driver.core.get(TENANT, "s")
    # Dropped, and the engine computes the prefix into its blocks itself: active again.
    assert row.state == State.ACTIVE and host.tiers[1].used_blocks == 0
    assert _kinds(host, "s")[-2:] == ["corrupt", "recompute"]
    # The engine computed the whole prompt and reports the turn: it parks again.
    again = park_turn(driver, TENANT, "s", turn2, blocks2, tier="dram")
    assert again.row.state == State.PARKED and again.row.tier == "dram"


def test_a_shm_parked_session_survives_a_daemon_restart_and_restores_bit_exact(
    host: Host,
) -> None:
    engine, rng = host.engine, np.random.default_rng(4)
    tokens = list(range(30, 43))  # 13 tokens, 4 blocks
    blocks = engine.compute("r", tokens, rng)
    kept = engine.rows(blocks)
    park_turn(host.driver, TENANT, "s", tokens, blocks, tier="shm")
    engine.finish("r")

    host.restart()
    assert host.driver.core.get(TENANT, "s").state == State.PARKED
    turn2 = [*tokens, 1, 2, 3]
    assert host.driver.lookup(TENANT, "s", turn2) == 12
    blocks2 = engine.allocator.allocate("r2", 4)
    restored = restore_prefix(host.driver, TENANT, "s", turn2, blocks2)
    assert restored.tokens == 12 and restored.restored_from == RestoredFrom.SHM
    for now, before in zip(engine.rows(blocks2[:3]), kept, strict=True):
        assert np.array_equal(now, before[:3])


def test_rest_resume_of_an_external_session_is_refused_and_changes_nothing(host: Host) -> None:
    engine, driver, rng = host.engine, host.driver, np.random.default_rng(5)
    tokens = list(range(8))
    park_turn(driver, TENANT, "s", tokens, engine.compute("r", tokens, rng))
    with pytest.raises(InvalidStateError, match="restored into the engine's blocks"):
        driver.core.resume(TENANT, "s")
    assert driver.core.get(TENANT, "s").state == State.PARKED
    driver.core.check_invariants()


def test_a_failed_engine_copy_is_not_parked_and_not_called_kept(host: Host) -> None:
    engine, driver, rng = host.engine, host.driver, np.random.default_rng(6)
    tokens = list(range(8))
    plan = driver.prepare_store(TENANT, "s", tokens, engine.compute("r", tokens, rng))
    assert isinstance(plan, StorePlan)
    done = driver.complete_store(plan.store_id, False, None, "cudaMemcpy failed")
    assert done is not None and done.decision == Decision.NOT_PARKED == "not_parked"
    assert "cudaMemcpy failed" in done.why and done.row.state == State.ACTIVE
    assert all(t.used_blocks == 0 for t in host.tiers)
    assert _kinds(host, "s")[-2:] == ["turn", "pause_failed"]
    driver.core.check_invariants()


def test_a_turn_end_park_is_recorded_as_a_turn_end_not_an_explicit_pause(host: Host) -> None:
    engine, driver, rng = host.engine, host.driver, np.random.default_rng(7)
    tokens = list(range(8))
    park_turn(driver, TENANT, "s", tokens, engine.compute("r", tokens, rng), tool="search")
    pause = host.store.events(TENANT, "s", 1)[0]
    assert (pause.kind, pause.reason) == ("pause", Reason.TURN_END) == ("pause", "turn_end")
    assert driver.core.get(TENANT, "s").tool == "search"  # the wait starts at the turn end


def test_plans_are_plain_values_that_go_on_the_wire(host: Host) -> None:
    engine, driver, rng = host.engine, host.driver, np.random.default_rng(8)
    tokens = list(range(12))
    blocks = engine.compute("r", tokens, rng)
    plan = driver.prepare_store(TENANT, "s", tokens, blocks, tier="shm")
    assert isinstance(plan, StorePlan)
    wire = json.loads(json.dumps(plan.to_wire()))
    assert wire["tier"] == "shm" and wire["slots"] == list(plan.slots) and wire["checksum"]
    assert all(isinstance(v, int | str | bool | float | tuple) for v in vars(plan).values() if v)
    for dst, src in zip(host.tiers[1].buffers(), engine.arrays, strict=True):  # the engine
        dst[list(plan.slots)] = src[blocks]
    assert wire["fresh"] == [True, True, True]  # nothing of it was in the tier
    digests = block_digests(host.tiers[1], plan.slots)
    assert driver.complete_store(plan.store_id, True, digests) is not None
    load = driver.prepare_load(TENANT, "s", [*tokens, 1], 1, blocks)
    assert isinstance(load, LoadPlan) and load.start_block == 1
    wire = json.loads(json.dumps(load.to_wire()))
    assert wire["tier"] == "shm" and wire["slots"] == list(load.slots) == list(plan.slots[1:])
    assert wire["digests"] == digests[1:]
    assert driver.complete_load(load.load_id, True).tokens == 8  # blocks 1 and 2


def test_stored_and_removed_copies_are_events_taken_once(host: Host) -> None:
    engine, driver, rng = host.engine, host.driver, np.random.default_rng(9)
    tokens = list(range(8))
    blocks = engine.compute("r", tokens, rng)
    park_turn(driver, TENANT, "s", tokens, blocks)
    assert driver.take_events() == [BlocksStored(TENANT, "s", "dram", 2, _at(host, "pause"))]
    assert driver.take_events() == []
    restore_prefix(driver, TENANT, "s", [*tokens, 1], blocks)
    (removed,) = driver.take_events()
    assert isinstance(removed, BlocksRemoved)
    assert (removed.tier, removed.num_blocks, removed.session_id) == ("dram", 2, "s")
    park_turn(driver, TENANT, "s", [*tokens, 1], engine.compute("r2", [*tokens, 1], rng))
    driver.core.delete(TENANT, "s")
    assert [type(e) for e in driver.take_events()] == [BlocksStored, BlocksRemoved]


def _at(host: Host, kind: str) -> float:
    return next(e.at for e in host.store.events(TENANT, "s", 100) if e.kind == kind)


def test_the_external_host_offers_only_what_an_external_engine_supports(host: Host) -> None:
    core = host.driver.core
    assert not isinstance(core.host, EngineHost) and core.engine is None
    for method in ("claim", "claim_now", "recompute", "engine_lock_now", "wake"):
        assert not hasattr(core.host, method)
    assert core.pause_now(TENANT, "nobody") is None  # no fast path without an engine


def test_events_nobody_takes_are_bounded_oldest_dropped_first(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agentpark.parking.external.manager.EVENTS_KEPT", 3)
    host.restart()  # a manager made with the smaller bound
    engine, driver, rng = host.engine, host.driver, np.random.default_rng(10)
    for n in range(3):  # three parks, each a stored event, two of them removed again
        tokens = list(range(n, n + 8))
        park_turn(driver, TENANT, f"s{n}", tokens, engine.compute(f"r{n}", tokens, rng))
        if n < 2:
            driver.core.delete(TENANT, f"s{n}")
    taken = driver.take_events()
    assert [(type(e).__name__, e.session_id) for e in taken] == [
        ("BlocksStored", "s1"),
        ("BlocksRemoved", "s1"),
        ("BlocksStored", "s2"),
    ]
