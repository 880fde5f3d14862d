"""The connector's two sides, driven as vLLM drives them, against the real daemon side.

The scheduler side (agentpark.connectors.scheduler) and the worker side
(agentpark.connectors.worker) are the connector's own code; vLLM and torch are not in this
venv, so vLLM's request and config objects are plain stand-ins with the attributes read,
and the worker's copies write the daemon's real /dev/shm pool file with numpy
(``NumpyCopies``, a STAND-IN for agentpark.connectors.torch_copies; the real one runs in
tests/vllm_real). The daemon is the real VllmService over its control socket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from agentpark.blocks import PoolGeometry
from agentpark.connectors.client import ControlClient
from agentpark.connectors.copies import Copies, CopyRefused, OffCopies
from agentpark.connectors.protocol import Layout, PoolFile
from agentpark.connectors.scheduler import OffScheduler, SchedulerSide
from agentpark.connectors.steps import LoadMeta, StepPlan, StoreMeta
from agentpark.connectors.worker import OffWorker, WorkerSide
from agentpark.enums import State
from agentpark.integrity import blocks_intact
from agentpark.tiers.base import HostTier
from tests.connectors.conftest import TENANT, ControlDaemon
from tests.control.test_control import BLOCK, LAYOUT, Worker, _View


@dataclass
class Request:
    """What the connector reads of vLLM's ``Request``."""

    request_id: str
    all_token_ids: list[int]
    kv_transfer_params: dict[str, Any] | None
    num_computed_tokens: int = 0


@dataclass
class Blocks:
    """What the connector reads of vLLM's ``KVCacheBlocks``."""

    ids: list[int] = field(default_factory=list)

    def get_block_ids(self) -> tuple[list[int]]:
        return (self.ids,)


class NumpyCopies(Copies):
    """STAND-IN for torch's copies: engine blocks are numpy arrays, the pool the real file."""

    def __init__(self, client: ControlClient, pool: Worker, layout: Layout) -> None:
        super().__init__(client)
        self.pool = pool
        rng = np.random.default_rng(7)
        self.kv = [
            rng.integers(0, 60_000, (layout.num_blocks, *shape)).astype(dtype)
            for shape, dtype in layout.arrays
        ]
        self.stores = 0

    def store(self, store: StoreMeta) -> list[str] | None:
        self.stores += 1
        for src, dst in zip(self.kv, self.pool.arrays, strict=True):
            dst[store.slots] = src[store.block_ids]
        return self.pool.digests(store.slots) if store.checksum else None

    def load(self, load: LoadMeta) -> None:
        view = _View(self.pool.geometry, [np.asarray(a) for a in self.pool.arrays])
        tier: HostTier = view  # type: ignore[assignment]  # integrity reads geometry, buffers
        if load.digests is not None and not blocks_intact(tier, load.slots, load.digests):
            raise CopyRefused("a parked block fails its checksum", "checksum")
        for src, dst in zip(self.pool.arrays, self.kv, strict=True):
            dst[load.block_ids] = src[load.slots]


def _config() -> Any:
    return SimpleNamespace(cache_config=SimpleNamespace(block_size=BLOCK))


def _client(daemon: ControlDaemon) -> ControlClient:
    """A connector's client with room for a loaded test machine (vLLM's default is 50 ms)."""
    client = ControlClient(None, socket_path=str(daemon.service.socket_path), timeout_s=10.0)
    daemon.client.close()
    daemon.client = client  # closed with the daemon
    return client


def _sides(daemon: ControlDaemon) -> tuple[SchedulerSide, WorkerSide, NumpyCopies]:
    client = _client(daemon)
    answer = daemon.call("register", layout=LAYOUT.to_wire())
    assert answer["ok"], answer
    pool = Worker(PoolFile.from_wire(answer["pool"]), LAYOUT)
    scheduler = SchedulerSide(client, tenant=TENANT, block_size=BLOCK)
    worker = WorkerSide(client, _config(), None, {})
    copies = NumpyCopies(client, pool, LAYOUT)
    worker.copies = copies
    return scheduler, worker, copies


def _turn(
    request_id: str, session_id: str | None, blocks: int, extra: int = 1, base: int = 1000
) -> Request:
    tokens = list(range(base, base + blocks * BLOCK + extra))
    params = None
    if session_id is not None:
        agentpark = {"session_id": session_id, "tool": "search", "expected_resume_s": 60.0}
        params = {"agentpark": agentpark}
    return Request(request_id, tokens, params, num_computed_tokens=len(tokens))


def _step(worker: WorkerSide, plan: StepPlan, *, deferred: bool = False) -> set[str]:
    """One engine step's worker hooks in vLLM's order (``deferred``: finalize after)."""
    worker.start_load_kv(plan)
    if not deferred:
        worker.run_stores(plan)  # wait_for_save
    sent, _ = worker.get_finished(plan)
    if deferred:
        worker.run_stores(plan)  # vLLM's deferred finalize: wait_for_save after get_finished
    return sent or set()


def test_after_many_requests_nothing_is_left_on_either_side(control_daemon: ControlDaemon) -> None:
    daemon = control_daemon
    scheduler, worker, copies = _sides(daemon)
    n, stores = 24, 0
    for i in range(n):
        # Each agent its own tokens: one agent's parked blocks are no other's by content.
        parked = _turn(f"p{i}", f"agent-{i}", blocks=2, base=1000 + 100 * i)
        plain = _turn(f"x{i}", None, blocks=1, base=50_000 + 100 * i)
        for request in (parked, plain):
            assert scheduler.get_num_new_matched_tokens(request, 0) == (0, False)
        keep, answer = scheduler.request_finished(parked, [2 * i, 2 * i + 1, 60])
        assert keep and answer is not None and answer["agentpark"]["decision"] == "parked"
        # No session: served by content, parked as an anonymous one when the daemon says so.
        anon, said = scheduler.request_finished(plain, [63])
        assert said is not None and said["agentpark"]["decision"] == ("parked" if anon else "kept")
        stores += 1 + anon
        plan = scheduler.build_plan()
        done = {f"p{i}", f"x{i}"} if anon else {f"p{i}"}
        assert _step(worker, plan, deferred=i % 2 == 1) == done
        assert copies.stores == stores  # each store copied once, whichever hook came first
    assert scheduler.requests_in_flight == 0
    assert worker.requests_sending == 0
    assert copies.copied_this_step == 1 + anon  # the last step's stores, until the next
    assert _step(worker, scheduler.build_plan()) == set()
    assert copies.copied_this_step == 0
    core = daemon.service.driver.core
    assert {core.get(TENANT, f"agent-{i}").state for i in range(n)} == {State.PARKED}


def test_a_parked_turn_is_loaded_back_into_the_blocks_vllm_allocated(
    control_daemon: ControlDaemon,
) -> None:
    daemon = control_daemon
    scheduler, worker, copies = _sides(daemon)
    first = _turn("r1", "agent", blocks=3)
    scheduler.get_num_new_matched_tokens(first, 0)
    scheduler.request_finished(first, [4, 5, 6])
    _step(worker, scheduler.build_plan())
    parked = [kv[[4, 5, 6]].copy() for kv in copies.kv]
    for kv in copies.kv:
        kv[[4, 5, 6, 20, 21, 22]] = 0  # vLLM reuses the freed blocks

    second = _turn("r2", "agent", blocks=3, extra=5)
    assert scheduler.get_num_new_matched_tokens(second, 0) == (3 * BLOCK, False)
    scheduler.update_state_after_alloc(second, Blocks([20, 21, 22, 23]), 3 * BLOCK)
    plan = scheduler.build_plan()
    assert [load.block_ids for load in plan.loads] == [[20, 21, 22]]
    _step(worker, plan)
    assert worker.get_block_ids_with_load_errors() == set()
    for kv, want in zip(copies.kv, parked, strict=True):
        np.testing.assert_array_equal(kv[[20, 21, 22]], want)
    keep, answer = scheduler.request_finished(second, [])
    assert not keep and answer is not None
    assert answer["agentpark"]["restored_tokens"] == 3 * BLOCK
    assert scheduler.requests_in_flight == 0


def test_a_damaged_copy_is_not_loaded_and_its_blocks_are_recomputed(
    control_daemon: ControlDaemon,
) -> None:
    daemon = control_daemon
    scheduler, worker, copies = _sides(daemon)
    first = _turn("r1", "s", blocks=2)
    scheduler.request_finished(first, [1, 2])
    plan = scheduler.build_plan()
    _step(worker, plan)
    copies.pool.arrays[0][plan.stores[0].slots[0]].flat[3] ^= 1
    second = _turn("r2", "s", blocks=2)
    n, _ = scheduler.get_num_new_matched_tokens(second, 0)
    scheduler.update_state_after_alloc(second, Blocks([8, 9, 10]), int(n or 0))
    _step(worker, scheduler.build_plan())
    bad = worker.get_block_ids_with_load_errors()
    assert bad == {8, 9}
    scheduler.loads_failed(bad)
    _, answer = scheduler.request_finished(second, [])
    assert answer is not None and answer["agentpark"]["restored_tokens"] == 0
    assert daemon.client.counts["load_checksum"] == 1
    assert daemon.service.driver.core.get(TENANT, "s").state == State.ACTIVE


def test_a_worker_with_agentpark_off_still_hands_every_planned_store_back(
    control_daemon: ControlDaemon,
) -> None:
    daemon = control_daemon
    scheduler, _, _ = _sides(daemon)
    worker = OffWorker(daemon.client, _config(), None, "tensor parallel > 1")
    worker.register_kv_caches({})
    assert isinstance(worker.copies, OffCopies)
    request = _turn("r1", "off", blocks=2)
    keep, _ = scheduler.request_finished(request, [3, 4])
    assert keep
    assert _step(worker, scheduler.build_plan()) == {"r1"}  # vLLM frees the blocks
    row = daemon.service.driver.core.get(TENANT, "off")
    assert row.state == State.ACTIVE
    failed = daemon.store.events(TENANT, "off", 1)[0]
    assert failed.kind == "pause_failed" and "tensor parallel > 1" in (failed.detail or "")
    assert worker.requests_sending == 0


@pytest.mark.parametrize("params", [None, {"agentpark": {"session_id": "s"}}])
def test_a_scheduler_with_agentpark_off_matches_nothing_and_says_why(
    control_daemon: ControlDaemon, params: dict[str, Any] | None
) -> None:
    scheduler = OffScheduler(
        _client(control_daemon), tenant=TENANT, block_size=BLOCK, why="pipeline parallel"
    )
    request = Request("r", list(range(3 * BLOCK)), params, 3 * BLOCK)
    assert scheduler.get_num_new_matched_tokens(request, 0) == (0, False)
    keep, answer = scheduler.request_finished(request, [1, 2, 3])
    assert not keep and scheduler.build_plan() == StepPlan()
    assert answer is not None
    assert answer["agentpark"] == {
        "decision": "kept",
        "why": "pipeline parallel",
        "restored_tokens": 0,
        "restored_from": None,
    }
    assert scheduler.requests_in_flight == 0


def test_a_layout_is_one_geometry_on_the_daemon_and_in_the_worker(
    control_daemon: ControlDaemon,
) -> None:
    _sides(control_daemon)
    mine = PoolGeometry.from_layout(LAYOUT.num_blocks, LAYOUT.block_size, LAYOUT.arrays)
    tier = control_daemon.service.tier
    assert tier is not None
    assert (tier.geometry.block_size, tier.geometry.arrays) == (BLOCK, mine.arrays)
    assert mine.block_nbytes == 2 * (2 * BLOCK * 8 * 2)
    with pytest.raises(ValueError, match="positive"):
        PoolGeometry.from_layout(4, BLOCK, [((2, 0), "uint16")])
