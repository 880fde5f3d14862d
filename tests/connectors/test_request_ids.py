"""The connector names vLLM's request in its ops, and the daemon's events name it too: the
scheduler side as vLLM drives it, against the real daemon side (tests/connectors)."""

from __future__ import annotations

from tests.connectors.conftest import TENANT, ControlDaemon
from tests.connectors.test_vllm_sides import BLOCK, Blocks, _sides, _step, _turn


def _requests(daemon: ControlDaemon, session_id: str) -> list[tuple[str, str | None]]:
    events = reversed(daemon.store.events(TENANT, session_id, 100))
    return [(e.kind, e.request_id) for e in events]


def test_the_events_of_a_turn_name_the_vllm_request_that_caused_them(
    control_daemon: ControlDaemon,
) -> None:
    daemon = control_daemon
    scheduler, worker, _ = _sides(daemon)
    first = _turn("chatcmpl-1-0a0b0c0d", "agent", blocks=3)
    scheduler.get_num_new_matched_tokens(first, 0)
    scheduler.request_finished(first, [4, 5, 6])
    _step(worker, scheduler.build_plan())
    second = _turn("chatcmpl-2-1a1b1c1d", "agent", blocks=3, extra=5)
    assert scheduler.get_num_new_matched_tokens(second, 0) == (3 * BLOCK, False)
    scheduler.update_state_after_alloc(second, Blocks([20, 21, 22, 23]), 3 * BLOCK)
    _step(worker, scheduler.build_plan())
    scheduler.request_finished(second, [])  # nothing of its own to park: kept
    assert _requests(daemon, "agent") == [
        ("create", None),  # made by the first turn's end, before it held the session
        ("turn", "chatcmpl-1-0a0b0c0d"),
        ("pause", "chatcmpl-1-0a0b0c0d"),
        ("tool_return", "chatcmpl-2-1a1b1c1d"),  # back from "search": this request's match
        ("resume", "chatcmpl-2-1a1b1c1d"),
    ]
    # The daemon's own work on the session afterwards names no request.
    daemon.service.driver.core.delete(TENANT, "agent")
    assert _requests(daemon, "agent")[-1] == ("delete", None)


def test_a_request_id_the_daemon_would_refuse_is_left_out_and_the_turn_still_parks(
    control_daemon: ControlDaemon,
) -> None:
    daemon = control_daemon
    scheduler, worker, _ = _sides(daemon)
    for i, rid in enumerate(("x" * 300, "bad\nid")):  # a client's X-Request-Id, as vLLM keeps it
        request = _turn(rid, f"agent-{i}", blocks=2)
        keep, answer = scheduler.request_finished(request, [1, 2])
        assert keep and answer is not None and answer["agentpark"]["decision"] == "parked"
        _step(worker, scheduler.build_plan())
        assert {r for _, r in _requests(daemon, f"agent-{i}")} == {None}
