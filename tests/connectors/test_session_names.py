"""The scheduler side serving sessions vLLM names, and agentpark's kv_hints actions.

Driven as vLLM drives it (tests/connectors/test_vllm_sides.py's sides: the worker's copies
write the daemon's real /dev/shm pool) against the real daemon side over its control
socket; vLLM's ``Request`` is a STAND-IN with the attributes vLLM 0.32 gives it
(``session_id``, ``kv_hints``). The counts are read where the daemon keeps them, after
the connector's next call carried them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentpark.connectors.scheduler import OffScheduler, SchedulerSide
from agentpark.enums import State
from tests.connectors.conftest import TENANT, ControlDaemon
from tests.connectors.test_hints import KvHintAction, KvHintsEnvelope, action, envelope
from tests.connectors.test_vllm_sides import BLOCK, Blocks, _client, _sides, _step


@dataclass
class Request:
    """What the connector reads of vLLM 0.32's ``Request``."""

    request_id: str
    all_token_ids: list[int]
    kv_transfer_params: dict[str, Any] | None
    num_computed_tokens: int = 0
    session_id: str | None = None
    kv_hints: KvHintsEnvelope | None = None


def _turn(
    request_id: str,
    blocks: int,
    *,
    session_id: str | None = None,
    params: dict[str, Any] | None = None,
    hints: KvHintsEnvelope | None = None,
    extra: int = 1,
) -> Request:
    tokens = list(range(1000, 1000 + blocks * BLOCK + extra))
    return Request(request_id, tokens, params, len(tokens), session_id, hints)


def _pause(tool: str = "search", expected: float = 60.0) -> KvHintAction:
    return action("agentpark.pause", {"tool": tool, "expected_resume_s": expected})


def _counts(daemon: ControlDaemon, scheduler: SchedulerSide) -> dict[str, int]:
    """The daemon's counts for the tenant, once the connector's next call carried them."""
    scheduler.get_num_new_matched_tokens(_turn("flush", 1, session_id="flush"), 0)
    scheduler.request_finished(_turn("flush", 1, session_id="flush"), [])
    return daemon.service.degraded.of_tenant(TENANT)


def test_a_turn_named_by_vllms_session_id_parks_and_its_next_turn_is_loaded(
    control_daemon: ControlDaemon,
) -> None:
    daemon = control_daemon
    scheduler, worker, _ = _sides(daemon)
    first = _turn("r1", 3, session_id="conv-1", hints=envelope(_pause("read_file")))
    assert scheduler.get_num_new_matched_tokens(first, 0) == (0, False)
    keep, answer = scheduler.request_finished(first, [4, 5, 6])
    assert keep and answer is not None
    assert answer["agentpark"]["decision"] == "parked"
    assert answer["agentpark"]["hints"] == ["agentpark.pause/1"]
    _step(worker, scheduler.build_plan())
    row = daemon.service.driver.core.get(TENANT, "conv-1")
    assert row.state == State.PARKED and row.tool == "read_file"

    second = _turn("r2", 3, session_id="conv-1", extra=5)
    assert scheduler.get_num_new_matched_tokens(second, 0) == (3 * BLOCK, False)
    scheduler.update_state_after_alloc(second, Blocks([20, 21, 22, 23]), 3 * BLOCK)
    _step(worker, scheduler.build_plan())
    _, answer = scheduler.request_finished(second, [])
    assert answer is not None and answer["agentpark"]["restored_tokens"] == 3 * BLOCK


def test_kv_transfer_params_name_the_session_before_vllms_session_id(
    control_daemon: ControlDaemon,
) -> None:
    daemon = control_daemon
    scheduler, worker, _ = _sides(daemon)
    params = {"agentpark": {"session_id": "ours", "tool": "search", "expected_resume_s": 60}}
    keep, _ = scheduler.request_finished(_turn("r1", 2, session_id="vllms", params=params), [1, 2])
    assert keep
    _step(worker, scheduler.build_plan())
    sessions = {row.session_id for row, _ in daemon.service.driver.core.sessions_with_kv()}
    assert sessions == {"ours"}


def test_an_invalid_vllm_session_id_parks_nothing_and_is_counted(
    control_daemon: ControlDaemon,
) -> None:
    daemon = control_daemon
    scheduler, _, _ = _sides(daemon)
    for i, named in enumerate(["bad id", "x" * 200, "a\n"]):
        request = _turn(f"r{i}", 2, session_id=named)
        assert scheduler.get_num_new_matched_tokens(request, 0) == (0, False)
        _keep, answer = scheduler.request_finished(request, [1, 2])
        assert answer is not None and answer["agentpark"]["decision"] in {"parked", "kept"}
    # Served as a request with no name (by content): the invalid name is never a session.
    names = {live.row.session_id for live in daemon.service.driver.core.registry.all()}
    assert not names & {"bad id", "x" * 200, "a\n"}
    assert all(name.startswith("anon-") for name in names)
    assert _counts(daemon, scheduler).get("session_id_invalid") == 3


def test_a_malformed_agentpark_hint_neither_loads_nor_parks_and_is_counted(
    control_daemon: ControlDaemon,
) -> None:
    daemon = control_daemon
    scheduler, worker, _ = _sides(daemon)
    scheduler.request_finished(_turn("r1", 2, session_id="s", hints=envelope(_pause())), [1, 2])
    _step(worker, scheduler.build_plan())
    assert daemon.service.driver.core.get(TENANT, "s").state == State.PARKED
    bad = envelope(action("agentpark.pause", {"tool": "search", "expected_resume_s": "60"}))
    second = _turn("r2", 2, session_id="s", hints=bad, extra=3)
    assert scheduler.get_num_new_matched_tokens(second, 0) == (0, False)  # parked, not loaded
    keep, answer = scheduler.request_finished(second, [7, 8])
    assert not keep and answer is not None
    assert answer["agentpark"]["decision"] == "refused"
    assert "kv_hints: agentpark.pause v1: expected_resume_s" in answer["agentpark"]["why"]
    assert scheduler.build_plan().stores == []
    assert _counts(daemon, scheduler).get("hint_invalid") == 1
    assert daemon.service.driver.core.get(TENANT, "s").state == State.PARKED  # as it was


def test_foreign_hint_actions_are_counted_and_the_turn_parks_as_without_them(
    control_daemon: ControlDaemon,
) -> None:
    daemon = control_daemon
    scheduler, worker, _ = _sides(daemon)
    hints = envelope(action("vendor.retain", {"ttl": 9}), _pause())
    keep, answer = scheduler.request_finished(_turn("r1", 2, session_id="f", hints=hints), [1, 2])
    assert keep and answer is not None and answer["agentpark"]["decision"] == "parked"
    _step(worker, scheduler.build_plan())
    assert _counts(daemon, scheduler).get("hint_ignored") == 1


def test_a_release_hint_parks_nothing_and_deletes_the_parked_session(
    control_daemon: ControlDaemon,
) -> None:
    daemon = control_daemon
    core = daemon.service.driver.core
    scheduler, worker, _ = _sides(daemon)
    tier = daemon.service.tier
    assert tier is not None
    scheduler.request_finished(
        _turn("r1", 3, session_id="done", hints=envelope(_pause())), [1, 2, 3]
    )
    _step(worker, scheduler.build_plan())
    assert core.get(TENANT, "done").state == State.PARKED
    used = tier.used_blocks
    assert used >= 3

    last = _turn("r2", 3, session_id="done", hints=envelope(action("agentpark.release", {})))
    n, _ = scheduler.get_num_new_matched_tokens(last, 0)
    scheduler.update_state_after_alloc(last, Blocks([9, 10, 11, 12]), int(n or 0))
    _step(worker, scheduler.build_plan())
    keep, answer = scheduler.request_finished(last, [9, 10, 11, 12])
    assert not keep and answer is not None
    assert answer["agentpark"]["decision"] == "released"
    assert answer["agentpark"]["restored_tokens"] == 3 * BLOCK  # it was still loaded
    assert answer["agentpark"]["hints"] == ["agentpark.release/1"]
    assert scheduler.build_plan().stores == []
    assert core.get(TENANT, "done").state == State.DELETED
    assert tier.used_blocks == used - 3
    assert [e for e in daemon.kinds("done")][-1] == "delete"

    again = _turn("r3", 1, session_id="never", hints=envelope(action("agentpark.release", {})))
    _, answer = scheduler.request_finished(again, [1])
    assert answer is not None and answer["agentpark"]["decision"] == "kept"
    assert answer["agentpark"]["why"] == "no such session"


def test_a_scheduler_with_agentpark_off_releases_nothing(control_daemon: ControlDaemon) -> None:
    daemon = control_daemon
    scheduler, worker, _ = _sides(daemon)
    scheduler.request_finished(_turn("r1", 2, session_id="kept", hints=envelope(_pause())), [1, 2])
    _step(worker, scheduler.build_plan())
    off = OffScheduler(_client(daemon), tenant=TENANT, block_size=BLOCK, why="pipeline parallel")
    release = envelope(action("agentpark.release", {}))
    _, answer = off.request_finished(_turn("r2", 2, session_id="kept", hints=release), [1, 2])
    assert answer is not None and answer["agentpark"]["why"] == "pipeline parallel"
    assert daemon.service.driver.core.get(TENANT, "kept").state == State.PARKED


def test_a_request_with_no_session_is_served_by_content_and_release_skips_it(
    control_daemon: ControlDaemon,
) -> None:
    scheduler = SchedulerSide(_client(control_daemon), tenant=TENANT, block_size=BLOCK)
    release = envelope(action("agentpark.release", {}))
    _, answer = scheduler.request_finished(_turn("r1", 2, hints=release), [1, 2])
    assert answer is not None and answer["agentpark"]["decision"] == "kept"
    assert "anonymous" in answer["agentpark"]["why"]
