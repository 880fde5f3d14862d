"""Pins driven as vLLM drives the connector, against the real daemon side (control protocol 4).

The daemon answers with ``turn_end = "pin"`` (every turn pinned while room), so each test
knows the answer; the scheduler side holds the blocks, the worker reports them when a
pin is let go, and the daemon hears each end (``unpin``) with its cause. vLLM's block pool
is a stand-in with what the connector reads (tests/connectors/test_pins.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentpark.connectors.client import ControlClient
from agentpark.connectors.protocol import PROTOCOL, PoolFile
from agentpark.connectors.scheduler import SchedulerSide
from agentpark.connectors.worker import WorkerSide
from agentpark.store.db import open_database
from agentpark.store.migrate import upgrade
from agentpark.store.repository import SessionStore
from tests.connectors.conftest import TENANT, ControlDaemon, control_service
from tests.connectors.test_pins import BlockPool
from tests.connectors.test_vllm_sides import BLOCK, LAYOUT, Blocks, NumpyCopies, Worker, _step
from tests.connectors.test_vllm_sides import Request as _Request
from tests.harness import tiny_settings


def vllm_daemon(tmp_path: Path, shm_dir: Path, **vllm: Any) -> ControlDaemon:
    """The daemon's vLLM side with these ``[vllm]`` settings (a 1 MiB pool); close it."""
    settings = tiny_settings(
        tmp_path / "state",
        shm_dir,
        vllm={
            "enabled": True,
            "pool_capacity": 1 << 20,
            "pool_path": shm_dir / "pool",
            "pin_share": 0.5,  # the share these tests' engines are sized for
            **vllm,
        },
    )
    upgrade(settings.database_url)
    store = SessionStore(*open_database(settings.database_url))
    service = control_service(settings, store)
    service.start()
    client = ControlClient(None, socket_path=str(service.socket_path), timeout_s=10)
    return ControlDaemon(settings, store, service, client)


@pytest.fixture
def pin_daemon(tmp_path: Path, shm_dir: Path) -> Iterator[ControlDaemon]:
    """The daemon's vLLM side answering every turn end "pinned" (for 1 s)."""
    made = vllm_daemon(tmp_path, shm_dir, turn_end="pin", pin_ttl_s=1.0)
    yield made
    made.close()


class Sides:
    """A scheduler side and a worker side over one daemon, with a 48-block engine."""

    def __init__(self, daemon: ControlDaemon, free: int = 40) -> None:
        self.daemon = daemon
        client = daemon.client
        answer = daemon.call("register", layout=LAYOUT.to_wire())
        assert answer["ok"], answer
        self.scheduler = SchedulerSide(client, tenant=TENANT, block_size=BLOCK)
        self.pool = BlockPool(num_gpu_blocks=49, free=free)
        self.scheduler.engine.pool = self.pool
        cfg: Any = type("C", (), {"cache_config": type("B", (), {"block_size": BLOCK})})
        self.worker = WorkerSide(client, cfg, None, {})
        self.copies = NumpyCopies(
            client, Worker(PoolFile.from_wire(answer["pool"]), LAYOUT), LAYOUT
        )
        self.worker.copies = self.copies

    def step(self) -> set[str]:
        """One engine step: the plan built, the worker's hooks, vLLM told what it freed."""
        done = _step(self.worker, self.scheduler.build_plan())
        self.scheduler.finished_sending(done)
        return done

    def finish(self, request: _Request, blocks: list[int]) -> dict[str, Any]:
        assert self.scheduler.get_num_new_matched_tokens(request, 0) == (0, False)
        keep, answer = self.scheduler.request_finished(request, blocks)
        assert answer is not None
        said: dict[str, Any] = answer["agentpark"]
        assert keep == (said["decision"] in ("pinned", "parked")), said
        return said


def _turn(
    request_id: str, session_id: str, blocks: int, expected: float = 0.5, base: int = 1000
) -> _Request:
    tokens = list(range(base, base + blocks * BLOCK + 1))
    params = {
        "agentpark": {"session_id": session_id, "tool": "search", "expected_resume_s": expected}
    }
    return _Request(request_id, tokens, params, num_computed_tokens=len(tokens))


def pin_two(sides: Sides, late_s: float) -> None:
    """Session a pinned on blocks 1-2 (back in 0.5 s: request "soon"), then session b on
    blocks 3-4 (back in ``late_s``: request "late")."""
    for req, session, expected, base, blocks in (
        ("soon", "a", 0.5, 1000, [1, 2]),
        ("late", "b", late_s, 3000, [3, 4]),
    ):
        said = sides.finish(_turn(req, session, 2, expected=expected, base=base), blocks)
        assert said["decision"] == "pinned", said


def _events(daemon: ControlDaemon, session_id: str) -> list[str]:
    return daemon.kinds(session_id)


def test_a_pinned_turn_holds_its_blocks_until_the_session_returns(
    pin_daemon: ControlDaemon,
) -> None:
    sides = Sides(pin_daemon)
    assert pin_daemon.client.protocol == PROTOCOL >= 4
    said = sides.finish(_turn("r1", "s", blocks=3), [4, 5, 6])
    assert said["decision"] == "pinned" and said["why"]
    assert sides.step() == set()  # held: nothing copied, nothing reported
    assert sides.copies.stores == 0 and sides.scheduler.pins.blocks == 3
    # The next request: vLLM's own prefix cache hit the pinned blocks (3 blocks computed).
    second = _turn("r2", "s", blocks=4)
    sides.scheduler.get_num_new_matched_tokens(second, 3 * BLOCK)
    sides.scheduler.update_state_after_alloc(second, Blocks([4, 5, 6, 9]), 0)
    assert sides.step() == {"r1"}  # the pin let go once the new request holds its blocks
    assert sides.scheduler.pins.blocks == 0 and sides.scheduler.pins.released == {"return": 1}
    assert _events(pin_daemon, "s")[-1] == "unpin"
    assert not sides.scheduler.has_pending_block_frees()  # no pin: vLLM may preempt


def test_a_pin_whose_session_never_returns_is_let_go_at_its_time_out(
    pin_daemon: ControlDaemon,
) -> None:
    sides = Sides(pin_daemon)
    assert sides.finish(_turn("r1", "gone", blocks=2), [1, 2])["decision"] == "pinned"
    pin = sides.scheduler.pins.book.pins["r1"]
    assert 0 < pin.deadline - time.monotonic() <= 1.0
    deadline = time.monotonic() + 10
    done: set[str] = set()
    while not done:  # the engine steps while a delayed-free request is held
        assert time.monotonic() < deadline, "the pin was not let go at its time-out"
        done = sides.step()
        time.sleep(0.01)  # an engine step's pace, not a synchronisation
    assert done == {"r1"} and time.monotonic() >= pin.deadline
    assert sides.scheduler.pins.released == {"timeout": 1}
    assert _events(pin_daemon, "gone")[-1] == "unpin"


def test_under_pressure_pin_only_drops_the_latest_return_first_before_any_preemption(
    pin_daemon: ControlDaemon,
) -> None:
    sides = Sides(pin_daemon, free=2)
    scheduler = sides.scheduler
    pin_two(sides, late_s=20.0)
    sides.step()
    # Another session's request needs 4 blocks, 2 are free: it got none this step.
    blocked = _turn("new", "c", 3, base=9000)
    scheduler.get_num_new_matched_tokens(blocked, 0)
    plan = scheduler.build_plan()
    # The latest expected return goes first; turn_end = "pin" parks nothing: freed now.
    assert plan.stores == [] and plan.release == ["late"]
    assert scheduler.has_pending_block_frees()  # vLLM waits for these blocks, no preemption
    assert _step(sides.worker, plan) == {"late"}
    scheduler.finished_sending({"late"})
    assert sides.copies.stores == 0 and not scheduler.pins.in_flight
    assert scheduler.pins.released == {"pressure": 1} and list(scheduler.pins.book.pins) == ["soon"]
    assert pin_daemon.kinds("b")[-2:] == ["drop", "unpin"]
    # A running request that cannot allocate: the last pin goes, vLLM waits for it.
    assert scheduler.has_pending_block_frees()
    assert sides.step() == {"soon"} and not scheduler.pins.in_flight
    assert not scheduler.pins.book.pins  # nothing left: vLLM may preempt now


def test_under_pressure_an_unbacked_pin_is_parked_latest_return_first_before_any_preemption(
    tmp_path: Path, shm_dir: Path
) -> None:
    daemon = vllm_daemon(tmp_path, shm_dir)  # adaptive: both pauses are under pin_ttl_s 30 s
    try:
        sides = Sides(daemon, free=2)
        daemon.client.protocol = 4  # as a daemon before protocol 5 said: pins get no copy
        scheduler = sides.scheduler
        pin_two(sides, late_s=20.0)
        assert not any(p.backed for p in scheduler.pins.book.pins.values())
        sides.step()
        blocked = _turn("new", "c", 3, base=9000)
        scheduler.get_num_new_matched_tokens(blocked, 0)
        plan = scheduler.build_plan()
        # The latest expected return is offered again under pressure: parked (room, and
        # the recompute not measured yet), copied before its blocks are freed.
        assert [s.req_id for s in plan.stores] == ["late"] and plan.release == []
        assert scheduler.has_pending_block_frees()
        assert _step(sides.worker, plan) == {"late"}
        scheduler.finished_sending({"late"})
        assert not scheduler.pins.in_flight  # the blocks are vLLM's again
        assert scheduler.pins.released == {"pressure": 1}
        assert list(scheduler.pins.book.pins) == ["soon"]
        assert scheduler.pins.release_ms and scheduler.pins.release_ms[0] >= 0
    finally:
        daemon.close()


def test_pins_never_hold_more_than_their_share_of_the_engine(
    pin_daemon: ControlDaemon,
) -> None:
    sides = Sides(pin_daemon)
    sides.pool.num_gpu_blocks, sides.pool.free = 9, 4  # 8 usable, pins may hold 4
    assert sides.finish(_turn("r1", "a", 3, base=1000), [1, 2, 3])["decision"] == "pinned"
    said = sides.finish(_turn("r2", "b", 2, base=5000), [4, 5])
    assert said["decision"] in ("parked", "dropped"), said
    assert sides.scheduler.pins.blocks == 3


def test_vllm_shutting_down_lets_every_pin_go_and_the_daemon_hears_it(
    pin_daemon: ControlDaemon,
) -> None:
    sides = Sides(pin_daemon)
    assert sides.finish(_turn("r1", "held", 2), [1, 2])["decision"] == "pinned"
    sides.scheduler.shutdown()
    assert not sides.scheduler.pins.book.pins
    assert sides.scheduler.pins.released == {"shutdown": 1}
    assert _events(pin_daemon, "held")[-1] == "unpin"
