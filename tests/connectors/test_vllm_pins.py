"""Pins, parks and drops at a vLLM turn end (control protocol 4), through the real socket.

The daemon side only: the real VllmService (SQLite file, shm pool, control server) and the
connector's own ControlClient. What the connector does with the answer (keeping vLLM's
blocks allocated, freeing them) is tests/vllm_real's; here: that the daemon answers pin /
park / drop as ``[vllm] turn_end`` and the facts say, records and forgets pins, and
measures a pause from a turn end to the next request's ``match``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentpark.connectors.client import ControlClient
from agentpark.connectors.protocol import PROTOCOL
from agentpark.enums import Reason, State
from agentpark.parking.external.pins import GRACE_S
from agentpark.store.db import open_database
from agentpark.store.migrate import upgrade
from agentpark.store.repository import SessionStore
from agentpark.turns import build_turn
from tests.connectors.conftest import TENANT, ControlDaemon, control_service
from tests.control.harness import Raw
from tests.control.test_control import BLOCK, LAYOUT, _register
from tests.harness import tiny_settings

POOL = {"engine_total_blocks": 64, "engine_free_blocks": 40, "pinned_blocks": 0}
TOKENS = list(range(1, 2 * BLOCK + 1))  # two whole blocks

Make = Callable[..., ControlDaemon]


@pytest.fixture
def make(tmp_path: Path, shm_dir: Path) -> Iterator[Make]:
    made: list[ControlDaemon] = []

    def start(**vllm: Any) -> ControlDaemon:
        settings = tiny_settings(
            tmp_path / "state",
            shm_dir,
            vllm={
                "enabled": True,
                "pool_capacity": 1 << 20,
                "pool_path": shm_dir / "pool",
                **vllm,
            },
        )
        upgrade(settings.database_url)
        store = SessionStore(*open_database(settings.database_url))
        service = control_service(settings, store)
        service.start()
        client = ControlClient(None, socket_path=str(service.socket_path), timeout_s=10)
        daemon = ControlDaemon(settings, store, service, client)
        made.append(daemon)
        _register(daemon)
        return daemon

    yield start
    for daemon in made:
        daemon.close()


def _end(
    daemon: ControlDaemon, session_id: str | None, tokens: list[int] = TOKENS, **fields: Any
) -> dict[str, Any]:
    """A turn end as a protocol-4 connector says it."""
    blocks = list(range(10, 10 + len(tokens) // BLOCK))
    named = {} if session_id is None else {"session_id": session_id}
    answer = daemon.call("prepare_store", tokens, block_ids=blocks, **named, **{**POOL, **fields})
    assert answer["ok"], answer
    return answer


def _events(daemon: ControlDaemon, session_id: str) -> list[tuple[str, str, str | None]]:
    return [
        (e.kind, e.reason, e.detail) for e in reversed(daemon.store.events(TENANT, session_id, 100))
    ]


def test_hello_says_protocol_5_and_the_pin_share(make: Make) -> None:
    daemon = make(pin_share=0.25)
    conn = Raw(daemon.service.socket_path)
    try:
        hello = conn.hello()
    finally:
        conn.close()
    assert PROTOCOL == 5 and hello["protocol"] == 5 and hello["pin_share"] == 0.25


def test_pin_mode_pins_every_turn_for_pin_ttl_s_and_unpin_forgets_it(make: Make) -> None:
    daemon = make(turn_end="pin", pin_ttl_s=12.0)
    answer = _end(daemon, "a", tool="grep", expected_resume_s=300.0)
    assert answer["decision"] == "pinned" and answer["pin_ttl_s"] == 12.0, answer
    assert answer["session_id"] == "a" and answer["expected_resume_s"] == 300.0
    assert "turn_end=pin" in answer["why"]
    core = daemon.service.driver.core
    assert core.get(TENANT, "a").state == State.ACTIVE  # a pin is not a park
    pins = daemon.service.driver.turn_ends.pins
    pin = pins.get((TENANT, "a"))
    assert pin is not None and pin.blocks == 2 and pin.until - pin.since == 12.0
    assert pins.figures().sessions == 1 and pins.figures().blocks == 2
    assert _events(daemon, "a")[-1] == ("pin", Reason.TURN_END, answer["why"])

    done = daemon.call("unpin", session_id="a", cause="return", blocks=2, reused_tokens=2 * BLOCK)
    assert done == {"ok": True, "pinned": True, "why": "unpinned: return"}
    figures = pins.figures()
    assert figures.sessions == 0 and figures.released == {"return": 1}
    assert figures.tokens_saved == 2 * BLOCK
    assert figures.bytes_saved == 2 * daemon.service.driver.geometry.block_nbytes
    assert core.counters.prefill_tokens_avoided == 2 * BLOCK
    kind, reason, detail = _events(daemon, "a")[-1]
    assert (kind, reason) == ("unpin", Reason.RETURN) and detail is not None
    assert detail.startswith("return after")
    # Idempotent: the pin is over; a second unpin (or one for no pin) changes nothing.
    again = daemon.call("unpin", session_id="a", cause="timeout", blocks=2)
    assert again["ok"] and again["pinned"] is False
    assert pins.figures().released == {"return": 1}


def test_park_mode_answers_as_before_whatever_the_pool_says(make: Make) -> None:
    daemon = make(turn_end="park")
    short = _end(daemon, "s", tool="grep", expected_resume_s=0.1)
    assert short["decision"] == "kept", short  # break-even: too short to park
    long = _end(daemon, "l", tool="search", expected_resume_s=60.0)
    assert long["decision"] == "parked" and long["slots"], long
    assert daemon.service.driver.turn_ends.pins.figures().sessions == 0


def test_a_connector_that_says_nothing_of_the_pool_gets_park_or_keep(make: Make) -> None:
    daemon = make()  # adaptive, but no engine_total_blocks: it cannot pin
    answer = daemon.call(
        "prepare_store", TOKENS, session_id="old", block_ids=[1, 2], expected_resume_s=0.1
    )
    assert answer["decision"] == "kept", answer


def test_adaptive_pins_a_short_pause_for_its_expected_length_times_the_margin(
    make: Make,
) -> None:
    daemon = make(pin_margin=3.0, pin_ttl_s=30.0)
    answer = _end(daemon, "a", tool="grep", expected_resume_s=0.5)
    assert answer["decision"] == "pinned", answer
    assert answer["pin_ttl_s"] == pytest.approx(1.5) and answer["expected_resume_s"] == 0.5
    capped = _end(daemon, "b", tool="grep", expected_resume_s=20.0)
    assert capped["decision"] == "pinned" and capped["pin_ttl_s"] == 30.0, capped


def test_adaptive_parks_a_long_pause_when_the_copy_back_beats_the_recompute(make: Make) -> None:
    daemon = make()
    answer = _end(daemon, "a", tool="human", expected_resume_s=120.0, prefill_ms_per_token=5.0)
    assert answer["decision"] == "parked" and answer["slots"], answer
    assert "costs less than recomputing" in answer["why"]


def test_adaptive_drops_a_long_pause_that_is_cheaper_to_recompute(make: Make) -> None:
    daemon = make()
    answer = _end(daemon, "a", tool="human", expected_resume_s=120.0, prefill_ms_per_token=0.0)
    assert answer["decision"] == "dropped", answer
    assert "dropped" in answer["why"] and "slots" not in answer
    assert daemon.service.driver.core.get(TENANT, "a").state == State.ACTIVE
    assert _events(daemon, "a")[-1] == ("drop", Reason.TURN_END, answer["why"])


def test_adaptive_does_not_pin_past_the_pin_share_or_with_the_pool_short(make: Make) -> None:
    daemon = make(pin_share=0.5)
    full = _end(daemon, "a", expected_resume_s=0.5, pinned_blocks=31, prefill_ms_per_token=5.0)
    assert full["decision"] == "parked" and "over pin_share 0.5" in full["why"], full
    short = _end(daemon, "b", expected_resume_s=0.5, engine_free_blocks=1, prefill_ms_per_token=5.0)
    assert short["decision"] == "parked" and "short of blocks" in short["why"], short
    assert daemon.service.driver.turn_ends.pins.figures().sessions == 0


def test_pressure_releases_a_pin_as_a_park_then_unpin_counts_it(make: Make) -> None:
    daemon = make()
    pinned = _end(daemon, "a", tool="grep", expected_resume_s=0.5)
    assert pinned["decision"] == "pinned"
    turns = _events(daemon, "a").count(("turn", Reason.EXPLICIT, "tokens=32 blocks=2"))
    let_go = _end(daemon, "a", tool="grep", pressure=True, prefill_ms_per_token=5.0)
    assert let_go["decision"] == "parked" and let_go["slots"], let_go
    assert "the pool needs the pinned blocks" in let_go["why"]
    # Not a new turn: recorded once; the park is the pressure's.
    assert _events(daemon, "a").count(("turn", Reason.EXPLICIT, "tokens=32 blocks=2")) == turns
    done = daemon.call("complete_store", store_id=let_go["store_id"], ok=False, detail="test")
    assert done["decision"] == "not_parked"
    unpinned = daemon.call("unpin", session_id="a", cause="pressure", blocks=2)
    assert unpinned["pinned"] is True
    assert daemon.service.driver.turn_ends.pins.figures().released == {"pressure": 1}


def test_pressure_drops_a_pin_whose_recompute_is_cheaper_and_never_pins_again(
    make: Make,
) -> None:
    daemon = make()
    assert _end(daemon, "a", expected_resume_s=0.5)["decision"] == "pinned"
    let_go = _end(daemon, "a", expected_resume_s=0.5, pressure=True, prefill_ms_per_token=0.0)
    assert let_go["decision"] == "dropped", let_go
    kind, reason, _ = _events(daemon, "a")[-1]
    assert (kind, reason) == ("drop", Reason.PRESSURE)


def test_an_anonymous_turn_is_pinned_under_the_name_the_daemon_made(make: Make) -> None:
    daemon = make()
    answer = _end(daemon, None, expected_resume_s=0.5)
    assert answer["decision"] == "pinned", answer
    name = answer["session_id"]
    assert name.startswith("anon-")
    assert daemon.call("unpin", session_id=name, cause="timeout", blocks=2)["pinned"] is True


def test_a_pin_with_no_unpin_is_forgotten_after_its_time_out_and_the_grace(make: Make) -> None:
    daemon = make()
    answer = _end(daemon, "a", expected_resume_s=1.0)
    assert answer["decision"] == "pinned"
    ends = daemon.service.driver.turn_ends
    pin = ends.pins.get((TENANT, "a"))
    assert pin is not None
    assert ends.expire(now=pin.until + GRACE_S - 0.1) == 0  # the connector may still say so
    assert ends.expire(now=pin.until + GRACE_S) == 1
    assert ends.pins.figures().released == {"expired": 1}
    assert _events(daemon, "a")[-1][:2] == ("unpin", Reason.EXPIRED)


def test_a_daemon_restart_forgets_pins(make: Make) -> None:
    daemon = make()
    assert _end(daemon, "a", expected_resume_s=0.5)["decision"] == "pinned"
    daemon.restart()
    assert daemon.service.driver.turn_ends.pins.figures().sessions == 0
    answer = daemon.call("unpin", session_id="a", cause="restart", blocks=2)
    assert answer["ok"] and answer["pinned"] is False


def test_the_pause_ends_at_the_next_match_and_is_learned_for_its_tool(make: Make) -> None:
    daemon = make()
    assert _end(daemon, "a", tool="grep", expected_resume_s=0.5)["decision"] == "pinned"
    daemon.call("match", [*TOKENS, 7], session_id="a", num_computed=2 * BLOCK)
    kind, _, detail = _events(daemon, "a")[-1]
    assert (kind, detail) == ("tool_return", "grep")
    row = daemon.service.driver.core.get(TENANT, "a")
    assert row.tool is None  # the wait is over; the next turn end does not count it again
    daemon.call("match", [*TOKENS, 7], session_id="a", num_computed=2 * BLOCK)
    assert [k for k, _, _ in _events(daemon, "a")].count("tool_return") == 1


def test_an_anonymous_pause_ends_at_the_match_of_a_request_that_continues_it(
    make: Make,
) -> None:
    daemon = make()
    answer = _end(daemon, None, tool="grep", expected_resume_s=0.5)
    name = answer["session_id"]
    # Another conversation's request (another prefix) closes nothing.
    daemon.call("match", [999, *TOKENS], num_computed=0)
    assert "tool_return" not in [k for k, _, _ in _events(daemon, name)]
    daemon.call("match", [*TOKENS, 7, 8], num_computed=2 * BLOCK)
    kind, _, detail = _events(daemon, name)[-1]
    assert (kind, detail) == ("tool_return", "grep")


def test_a_turn_with_no_expected_pause_uses_the_latest_pauses_of_any_tool(make: Make) -> None:
    daemon = make()
    first = _end(daemon, "a", tool="grep", expected_resume_s=0.5)
    assert first["decision"] == "pinned"
    daemon.call("match", [*TOKENS, 7], session_id="a", num_computed=2 * BLOCK)
    seconds, source = daemon.service.driver.turn_ends.pins.global_pause(0.5)
    assert seconds is not None and "latest 1 pauses" in source
    # An unnamed turn of an unknown tool: no figure of its own, the global one pins it.
    answer = _end(daemon, None, tool="never-seen")
    assert answer["decision"] == "pinned", answer
    assert "of any tool" in answer["why"]
    assert answer["expected_resume_s"] == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("fields", "decision"),
    [
        ({"expected_resume_s": 0.5}, "pinned"),
        ({"expected_resume_s": 120.0, "prefill_ms_per_token": 0.0}, "dropped"),
    ],
)
def test_a_requests_turn_says_it_was_pinned_or_dropped_and_why(
    make: Make, fields: dict[str, Any], decision: str
) -> None:
    daemon = make()
    answer = _end(daemon, "a", request_id="req-1", **fields)
    assert answer["decision"] == decision
    events = [e for e in reversed(daemon.store.events(TENANT, "a", 100)) if e.request_id]
    geometry = daemon.service.driver.geometry
    turn = build_turn(events, geometry.block_size, geometry.block_nbytes)
    assert turn.request_id == "req-1" and turn.decision == decision
    assert turn.why == answer["why"] and turn.tokens == 2 * BLOCK


def test_an_engine_restart_ends_its_pins_with_its_blocks(make: Make) -> None:
    daemon = make()
    assert _end(daemon, "a", expected_resume_s=0.5)["decision"] == "pinned"
    # A new engine registers (another connection, no engine id): the old one's pool is gone.
    restarted = ControlClient(None, socket_path=str(daemon.service.socket_path), timeout_s=10)
    try:
        answer = restarted.call("register", wait_s=10.0, layout=LAYOUT.to_wire())
        assert answer is not None and answer["ok"], answer
    finally:
        restarted.close()
    figures = daemon.service.driver.turn_ends.pins.figures()
    assert figures.sessions == 0 and figures.released == {"shutdown": 1}
    assert daemon.service.driver.core.get(TENANT, "a").state == State.LOST
