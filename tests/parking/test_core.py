"""Parking without HTTP: accounting invariants under a seeded random workload, and failures."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence

import pytest

from agentpark.config import Settings
from agentpark.engine.base import EngineAdapter
from agentpark.errors import AgentparkError, TransferError
from agentpark.parking import PauseOrder, SessionCore
from agentpark.runtime import Runtime
from agentpark.tiers.base import HostTier


@pytest.fixture
def runtime(make_settings: Callable[..., Settings]) -> Iterator[Runtime]:
    runtime = Runtime.start(
        make_settings(
            pool={"num_blocks": 24},
            tiers={"dram": {"capacity": 12 * 4096}, "shm": {"capacity": 10 * 4096}},
            # One thread: nobody else frees blocks, so a full pool answers 507 at once.
            limits={"admission_timeout_s": 0},
        )
    )
    yield runtime
    runtime.shutdown()


def test_accounting_invariant_holds_after_every_step_of_a_random_workload(
    runtime: Runtime,
) -> None:
    parking = runtime.parking
    rng = random.Random(1234)
    ids: list[str] = []
    outcomes: dict[str, int] = {}
    with_kv = 0  # the most sessions holding KV at once
    for step in range(300):
        op = rng.choice(["create", "generate", "generate", "pause", "resume", "delete", "move"])
        if op == "create" or not ids:
            sid = f"s{step}"
            parking.create("t", sid, None)
            ids.append(sid)
            op = "create"
        else:
            sid = rng.choice(ids)
        try:
            if op == "generate":
                prompt = [rng.randrange(256) for _ in range(rng.randrange(0, 20))] or [1]
                runtime.driver.generate("t", sid, prompt, rng.randrange(1, 24))
            elif op == "pause":
                parking.pause("t", sid, PauseOrder(tier=rng.choice(["auto", "dram", "shm"])))
            elif op == "move":
                parking.move("t", sid, rng.choice(["dram", "shm"]))
            elif op == "resume":
                parking.resume("t", sid)
            elif op == "delete":
                parking.delete("t", sid)
                ids.remove(sid)
            outcome = "ok"
        except AgentparkError as exc:
            outcome = exc.code  # pool_full, tier_full, limit_exceeded are legitimate
        outcomes[f"{op}:{outcome}"] = outcomes.get(f"{op}:{outcome}", 0) + 1
        runtime.driver.check_invariants()
        alloc = runtime.engine.allocator
        assert alloc.num_free + alloc.num_used == alloc.total
        for name, tier in parking.tiers.items():
            held = [r.kv_blocks for r in parking.live_sessions() if r.tier == name]
            assert tier.used_blocks == sum(held), name
        # The policy loop's index of sessions holding KV agrees with a walk of them all.
        walked = {
            (r.tenant, r.session_id)
            for r in parking.live_sessions()
            if r.kv_blocks > 0 or r.state == "parked"
        }
        indexed = {(row.tenant, row.session_id) for row, _busy in parking.sessions_with_kv()}
        assert indexed == walked == set(parking.registry.tally.holders())
        with_kv = max(with_kv, len(walked))
    # the workload really exercised the full-pool and full-tier paths, not just the happy one
    assert outcomes.get("pause:ok", 0) > 10 and outcomes.get("resume:ok", 0) > 5
    assert outcomes.get("move:ok", 0) > 3
    assert with_kv > 3
    assert any(k.endswith(("pool_full", "tier_full")) for k in outcomes), outcomes


class FailingTransfer:
    """Fault injection: the real host_copy backend, failing the direction we choose."""

    def __init__(self, inner: object, fail: str) -> None:
        self.inner, self.fail, self.name = inner, fail, "failing"

    def d2h(
        self,
        engine: EngineAdapter,
        ids: Sequence[int],
        tier: HostTier,
        slots: Sequence[int],
        digest: bool = False,
    ) -> str | None:
        if self.fail == "d2h":
            raise OSError("injected copy failure")
        return self.inner.d2h(engine, ids, tier, slots, digest)  # type: ignore[attr-defined, no-any-return]

    def h2d(
        self,
        tier: HostTier,
        slots: Sequence[int],
        engine: EngineAdapter,
        ids: Sequence[int],
        digest: bool = False,
    ) -> str | None:
        if self.fail == "h2d":
            raise OSError("injected copy failure")
        return self.inner.h2d(tier, slots, engine, ids, digest)  # type: ignore[attr-defined, no-any-return]


def _parking_with(runtime: Runtime, fail: str) -> SessionCore:
    parking = runtime.parking
    assert parking.mover.transfer is not None
    parking.mover.transfer = FailingTransfer(parking.mover.transfer, fail)
    return parking


def test_failed_pause_keeps_the_session_active_and_frees_the_tier(runtime: Runtime) -> None:
    parking = _parking_with(runtime, "d2h")
    parking.create("t", "s", None)
    runtime.driver.generate("t", "s", [5, 6, 7], 10)
    blocks = list(runtime.engine.allocator.owned(("t", "s")))
    with pytest.raises(TransferError):
        parking.pause("t", "s")
    assert parking.get("t", "s").state == "active"
    assert runtime.engine.allocator.owned(("t", "s")) == blocks
    assert parking.tiers["dram"].used_blocks == 0
    runtime.driver.check_invariants()


def test_failed_restore_keeps_the_parked_copy(runtime: Runtime) -> None:
    parking = _parking_with(runtime, "h2d")
    parking.create("t", "s", None)
    runtime.driver.generate("t", "s", [5, 6, 7], 10)
    parking.pause("t", "s")
    used = runtime.engine.allocator.num_used
    with pytest.raises(TransferError):
        parking.resume("t", "s")
    row = parking.get("t", "s")
    assert row.state == "parked" and row.tier == "dram"
    assert runtime.engine.allocator.num_used == used
    assert parking.tiers["dram"].used_blocks == row.kv_blocks > 0
    parking.mover.transfer = parking.mover.transfer.inner  # type: ignore[attr-defined]
    assert parking.resume("t", "s").restored_from == "dram"
    runtime.driver.check_invariants()
