"""Sessions whose first blocks are the same engine blocks (vLLM's prefix cache, issue 19).

vLLM's prefix cache gives every request of a shared system prompt the same physical blocks,
so two sessions' turn ends name the same block ids, and a later turn arrives with the shared
prefix already computed (``num_computed``) and only its own tail evicted. The manager must
then give exactly the tail, loaded from the right parked slots into the engine's new blocks.
The engine here is a numpy pool with a scripted prefix cache; the core, a real /dev/shm tier,
SQLite and the checksums are the real ones; the load is the vLLM connector's: the manager's
plan from ``start_block`` (num_computed's blocks), copied by the core's mover.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agentpark.blocks import ArraySpec, PoolGeometry
from agentpark.enums import State
from agentpark.parking import ArrayPool, CoreOptions, ExternalManager, external_core
from agentpark.parking.external import park_turn
from agentpark.store.db import open_database
from agentpark.store.migrate import upgrade
from agentpark.store.repository import SessionStore
from agentpark.tiers.shm import ShmTier

BLOCK = 4
GEOMETRY = PoolGeometry(
    num_blocks=24, block_size=BLOCK, arrays=(ArraySpec((2, BLOCK, 8), "uint16"),)
)
TENANT = "t"
SYSTEM = list(range(500, 520))  # 5 whole blocks shared by every session
SHARED = len(SYSTEM) // BLOCK


@pytest.fixture
def parts(tmp_path: Path, shm_dir: Path) -> Iterator[tuple[ExternalManager, np.ndarray]]:
    url = f"sqlite:///{tmp_path / 'agentpark.db'}"
    upgrade(url)
    store = SessionStore(*open_database(url))
    pool = np.zeros((GEOMETRY.num_blocks, 2, BLOCK, 8), dtype=np.uint16)
    tier = ShmTier(shm_dir / "tier", GEOMETRY, 64 * GEOMETRY.block_nbytes, "fake-model")
    options = CoreOptions(checksum_tiers=frozenset({"shm"}))
    manager = external_core(
        store, GEOMETRY, "fake-model", [tier], pool=ArrayPool((pool,)), options=options
    )
    yield manager, pool
    manager.core.close()
    tier.close()
    store.close()


def _write(pool: np.ndarray, blocks: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    for b in blocks:
        pool[b] = rng.integers(0, 60_000, pool.shape[1:]).astype(pool.dtype)


def test_sessions_sharing_prefix_blocks_each_restore_only_their_evicted_tail(
    parts: tuple[ExternalManager, np.ndarray],
) -> None:
    manager, pool = parts
    prefix = list(range(SHARED))  # the engine's cached blocks of the system prompt
    _write(pool, prefix, 0)
    tails: dict[str, list[int]] = {}
    tokens: dict[str, list[int]] = {}
    for i, name in enumerate(["a", "b", "c"]):
        tail = [SHARED + 3 * i + j for j in range(3)]  # 3 blocks of its own
        _write(pool, tail, i + 1)
        tokens[name] = [*SYSTEM, *(1000 * (i + 1) + k for k in range(3 * BLOCK))]
        result = park_turn(manager, TENANT, name, tokens[name], [*prefix, *tail], tool="t")
        assert result.decision == "parked"
        tails[name] = tail
    kept = {name: pool[tails[name]].copy() for name in tails}
    shared_bytes = pool[prefix].copy()

    for name in ["c", "a"]:  # the engine evicted only the tails; the prefix is its cache hit
        pool[tails[name]] = 0
        turn = [*tokens[name], 7, 7, 7]
        num_computed = SHARED * BLOCK
        n = manager.lookup(TENANT, name, turn, num_computed)
        assert n == 3 * BLOCK, "exactly the session's own tail, beyond the shared prefix"
        fresh = [20, 21, 22] if name == "c" else [17, 18, 19]
        block_ids = [*prefix, *fresh]  # the request's blocks from its first
        plan = manager.prepare_load(TENANT, name, turn, SHARED, block_ids)
        tier = manager.core.tiers[plan.tier]
        assert manager.core.mover.restore(
            tier, plan.slots, plan.slots, manager.core.endpoint(), fresh, list(plan.digests)
        )
        restored = manager.complete_load(plan.load_id, True)
        assert restored.tokens == 3 * BLOCK
        assert np.array_equal(pool[fresh], kept[name]), f"{name}: its own tail, bit-exact"
        assert np.array_equal(pool[prefix], shared_bytes), "the shared blocks are untouched"
        assert manager.core.get(TENANT, name).state == State.ACTIVE
    assert manager.core.get(TENANT, "b").state == State.PARKED
    manager.core.check_invariants()
