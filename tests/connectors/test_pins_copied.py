"""A pin with a parked copy behind it (control protocol 5), driven as vLLM drives the
connector, against the real daemon side in its default ``adaptive`` mode.

The daemon pins a short pause and, when a park would pay (the host pool has room, the
copy back beats the recompute or the recompute is not measured yet), plans a copy too:
the worker copies the blocks at the next step and vLLM still holds them. A release under
pressure then frees at once (nothing copied on the waiting request's path), and a pin let
go at its time-out leaves the session parked, so its next turn loads the copy if vLLM
evicted the blocks meanwhile. vLLM's block pool is a stand-in (tests/connectors/test_pins.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentpark.enums import State
from tests.connectors.conftest import TENANT, ControlDaemon
from tests.connectors.test_pins_flow import Sides, _turn, pin_two, vllm_daemon
from tests.connectors.test_vllm_sides import BLOCK, Blocks, _step


@pytest.fixture
def adaptive_daemon(tmp_path: Path, shm_dir: Path) -> Iterator[ControlDaemon]:
    made = vllm_daemon(tmp_path, shm_dir)  # the defaults: turn_end adaptive
    yield made
    made.close()


def _state(daemon: ControlDaemon, session_id: str) -> str:
    live = daemon.service.driver.core.registry.find((TENANT, session_id))
    assert live is not None
    return str(live.row.state)


class Clock:
    """The scheduler side's monotonic clock, moved by the test (no sleeping)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_short_pause_is_pinned_with_a_copy_taken_behind_the_pin(
    adaptive_daemon: ControlDaemon,
) -> None:
    sides = Sides(adaptive_daemon)
    said = sides.finish(_turn("r1", "s", blocks=3, expected=0.5), [4, 5, 6])
    assert said["decision"] == "pinned" and "a parked copy behind it" in said["why"], said
    assert sides.step() == set()  # copied, and still held: vLLM frees nothing
    assert sides.copies.stores == 1 and sides.scheduler.pins.blocks == 3
    assert _state(adaptive_daemon, "s") == State.PARKED
    assert adaptive_daemon.kinds("s")[-2:] == ["pin", "pause"]
    # The next request: vLLM's own prefix cache hit the pinned blocks.
    second = _turn("r2", "s", blocks=4)
    assert sides.scheduler.get_num_new_matched_tokens(second, 3 * BLOCK) == (0, False)
    sides.scheduler.update_state_after_alloc(second, Blocks([4, 5, 6, 9]), 0)
    assert sides.step() == {"r1"}
    assert sides.scheduler.pins.released == {"return": 1}


def test_under_pressure_a_copied_pin_is_freed_at_once_with_nothing_to_copy(
    adaptive_daemon: ControlDaemon,
) -> None:
    sides = Sides(adaptive_daemon, free=8)
    scheduler = sides.scheduler
    pin_two(sides, late_s=8.0)
    assert sides.step() == set() and sides.copies.stores == 2  # both copied, both held
    sides.pool.free = 2
    blocked = _turn("new", "c", 3, base=9000)  # needs 4 blocks, 2 free: it got none
    scheduler.get_num_new_matched_tokens(blocked, 0)
    plan = scheduler.build_plan()
    # The latest expected return goes first, freed in this very step: no copy planned.
    assert plan.release == ["late"] and plan.stores == []
    assert scheduler.has_pending_block_frees()  # vLLM waits for them, no preemption
    assert _step(sides.worker, plan) == {"late"} and sides.copies.stores == 2
    scheduler.finished_sending({"late"})
    assert not scheduler.pins.in_flight and list(scheduler.pins.book.pins) == ["soon"]
    assert scheduler.pins.released == {"pressure": 1}
    assert _state(adaptive_daemon, "b") == State.PARKED  # its copy stays for its next turn
    assert adaptive_daemon.kinds("b")[-1] == "unpin"


def test_a_copied_pin_let_go_at_its_time_out_leaves_the_session_parked_for_its_next_turn(
    adaptive_daemon: ControlDaemon,
) -> None:
    sides = Sides(adaptive_daemon)
    clock = Clock()
    sides.scheduler.pins.clock = clock
    assert sides.finish(_turn("r1", "gone", blocks=3, expected=0.5), [1, 2, 3])["decision"] == (
        "pinned"
    )
    assert sides.step() == set()
    pin = sides.scheduler.pins.book.pins["r1"]
    clock.now = pin.deadline  # its time-out (expected 0.5 s x 2, at least 1 s)
    assert sides.step() == {"r1"} and sides.scheduler.pins.released == {"timeout": 1}
    assert _state(adaptive_daemon, "gone") == State.PARKED
    # vLLM evicted the blocks meanwhile: the next request loads the copy.
    back = _turn("r2", "gone", blocks=4)
    assert sides.scheduler.get_num_new_matched_tokens(back, 0) == (3 * BLOCK, False)


def test_a_connector_before_protocol_5_gets_a_pin_with_no_copy(
    adaptive_daemon: ControlDaemon,
) -> None:
    sides = Sides(adaptive_daemon)
    adaptive_daemon.client.protocol = 4  # as an older daemon said in hello: no backs_pins
    said = sides.finish(_turn("r1", "s", blocks=2, expected=0.5), [1, 2])
    assert said["decision"] == "pinned" and "copy" not in said["why"], said
    assert sides.step() == set() and sides.copies.stores == 0
    assert _state(adaptive_daemon, "s") == State.ACTIVE
