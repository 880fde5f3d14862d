"""What happened to a request: turns by session and by request id, through the REST API
of a daemon in vLLM mode (in-process ASGI), driven by a stand-in connector over the real
control socket."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentpark.config import Settings
from tests.api.standin import BLOCK, StandInEngine, vllm_mode
from tests.harness import InProcessApp, bearer, wait_until

# vLLM's ids: the client sees chatcmpl-<id>, the engine runs chatcmpl-<id>-<8 hex>.
FIRST, SECOND = "chatcmpl-aaa-0123abcd", "chatcmpl-bbb-89efcdab"
TOKENS = list(range(1, 3 * BLOCK + 1))  # three whole blocks


@dataclass
class Tenant:
    http: httpx.Client
    engine: StandInEngine


@pytest.fixture
def daemon(
    make_settings: Callable[..., Settings],
    app_factory: Callable[..., InProcessApp],
    shm_dir: Path,
) -> InProcessApp:
    return app_factory(make_settings(vllm=vllm_mode(shm_dir)))


@pytest.fixture
def tenant(daemon: InProcessApp) -> Iterator[Callable[[str], Tenant]]:
    made: list[Tenant] = []

    def make(name: str) -> Tenant:
        token = daemon.token(name)
        assert daemon.runtime.vllm is not None
        engine = StandInEngine(str(daemon.runtime.vllm.socket_path), token)
        http = httpx.Client(
            base_url="http://in-process", transport=daemon.transport, headers=bearer(token)
        )
        made.append(Tenant(http, engine))
        return made[-1]

    yield make
    for t in made:
        t.engine.close()
        t.http.close()


def _two_turns(t: Tenant, session_id: str = "agent") -> None:
    """Turn 1 ends parked; turn 2 restores it, then ends parked again."""
    assert t.engine.end_turn(session_id, TOKENS, FIRST)["decision"] == "parked"
    restored = t.engine.start_turn(session_id, [*TOKENS, 5, 6, 7], SECOND)
    assert restored["restored_tokens"] == 3 * BLOCK
    longer = list(range(1, 4 * BLOCK + 1))
    assert t.engine.end_turn(session_id, longer, SECOND)["decision"] == "parked"


def test_a_sessions_turns_say_per_request_what_was_restored_and_parked(
    tenant: Callable[[str], Tenant],
) -> None:
    a = tenant("a")
    _two_turns(a)
    answer = a.http.get("/v1/sessions/agent/turns")
    assert answer.status_code == 200, answer.text
    second, first = answer.json()["turns"]  # newest first
    assert first["request_id"] == FIRST and second["request_id"] == SECOND
    assert first["decision"] == "parked" and first["parked_tier"] == "shm"
    assert first["restored_tokens"] == 0 and first["restored_from"] is None
    assert first["tool"] == "search" and first["tokens"] == 3 * BLOCK
    assert first["park_bytes"] > 0 and first["park_ms"] >= 0
    assert second["decision"] == "parked" and second["tokens"] == 4 * BLOCK
    assert second["restored_tokens"] == 3 * BLOCK and second["restored_from"] == "shm"
    assert second["restore_ms"] >= 0 and second["restore_bytes"] == first["park_bytes"]
    kinds = [e["kind"] for e in second["events"]]
    # Back from its tool at the request's match (protocol 4), then restored, then parked.
    assert kinds[:2] == ["tool_return", "resume"] and kinds[-1] == "pause"
    assert {e["request_id"] for e in second["events"]} == {SECOND}
    # The limit keeps the newest.
    only = a.http.get("/v1/sessions/agent/turns", params={"limit": 1}).json()["turns"]
    assert [t["request_id"] for t in only] == [SECOND]


def test_a_request_is_found_by_the_id_its_client_saw(tenant: Callable[[str], Tenant]) -> None:
    a = tenant("a")
    _two_turns(a)
    seen = a.http.get("/v1/requests/chatcmpl-bbb")  # the stream chunk's id
    assert seen.status_code == 200, seen.text
    turn = seen.json()
    assert turn["request_id"] == SECOND and turn["session_id"] == "agent"
    assert (turn["decision"], turn["restored_tokens"]) == ("parked", 3 * BLOCK)
    assert a.http.get(f"/v1/requests/{SECOND}").json() == turn  # the engine's own id too
    assert a.http.get("/v1/requests/chatcmpl-aaa").json()["request_id"] == FIRST
    # A prefix that is not the client's whole id names nothing.
    for near in ("chatcmpl-bb", "chatcmpl-bbb-89ef", "chatcmpl"):
        assert a.http.get(f"/v1/requests/{near}").status_code == 404, near


def test_a_get_with_wait_s_answers_once_the_turns_end_is_recorded(
    daemon: InProcessApp, tenant: Callable[[str], Tenant]
) -> None:
    a = tenant("a")
    assert a.engine.end_turn("agent", TOKENS, FIRST)["decision"] == "parked"
    a.engine.start_turn("agent", [*TOKENS, 5, 6, 7], SECOND)  # restored: the answer streams
    longer = list(range(1, 4 * BLOCK + 1))
    plan = a.engine.end_turn("agent", longer, SECOND, copy=False)  # the copy is still due
    now = a.http.get("/v1/requests/chatcmpl-bbb").json()
    assert (now["ended"], now["decision"]) == (False, "restored")
    answers: list[httpx.Response] = []
    waiting = threading.Thread(
        target=lambda: answers.append(
            a.http.get("/v1/requests/chatcmpl-bbb", params={"wait_s": 10})
        )
    )
    waiting.start()
    hub = daemon.app.state.streams
    wait_until(lambda: hub.waiting("a") == 1)
    a.engine.copy(plan, len(longer))
    waiting.join(timeout=30)
    assert not waiting.is_alive() and answers[0].status_code == 200
    turn = answers[0].json()
    assert (turn["ended"], turn["decision"], turn["restored_tokens"]) == (True, "parked", 3 * BLOCK)
    assert hub.waiting("a") == 0
    # A turn whose end never comes: the wait runs out and says what is recorded.
    a.engine.start_turn("agent", [*longer, 9], "chatcmpl-ccc-00112233")
    late = a.http.get("/v1/requests/chatcmpl-ccc", params={"wait_s": 0.2}).json()
    assert (late["ended"], late["decision"]) == (False, "restored")
    gone = a.http.get("/v1/requests/chatcmpl-none", params={"wait_s": 0.2})
    assert gone.status_code == 404


def test_a_kept_turn_says_why_as_the_connector_was_told(tenant: Callable[[str], Tenant]) -> None:
    a = tenant("a")
    kept = a.engine.end_turn("quick", TOKENS, "cmpl-k-00000000", tool=None, expected_resume_s=0.0)
    assert kept["decision"] == "kept", kept
    turn = a.http.get("/v1/requests/cmpl-k").json()
    assert (turn["decision"], turn["why"]) == ("kept", kept["why"])
    assert turn["parked_tier"] is None and turn["park_bytes"] is None


def test_unknown_requests_and_sessions_are_404_with_a_body_naming_them(
    tenant: Callable[[str], Tenant],
) -> None:
    a = tenant("a")
    missing = a.http.get("/v1/requests/chatcmpl-never")
    assert missing.status_code == 404
    error = missing.json()["error"]
    assert error["code"] == "request_not_found"
    assert error["details"] == {"request_id": "chatcmpl-never"}
    nobody = a.http.get("/v1/sessions/nobody/turns")
    assert nobody.status_code == 404
    assert nobody.json()["error"]["code"] == "session_not_found"
    bad = a.http.get("/v1/requests/" + "x" * 257)
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"


def test_a_session_with_no_engine_turn_has_none(tenant: Callable[[str], Tenant]) -> None:
    a = tenant("a")
    assert a.http.post("/v1/sessions", json={"session_id": "rest"}).status_code == 201
    assert a.http.get("/v1/sessions/rest/turns").json() == {"turns": []}


def test_another_tenant_sees_none_of_the_turns(tenant: Callable[[str], Tenant]) -> None:
    a, b = tenant("a"), tenant("b")
    _two_turns(a)
    assert b.http.get("/v1/requests/chatcmpl-bbb").status_code == 404
    assert b.http.get(f"/v1/requests/{SECOND}").status_code == 404
    assert b.http.get("/v1/sessions/agent/turns").status_code == 404
    # b's own session of the same name and its own request of the same id stay b's.
    assert b.engine.end_turn("agent", TOKENS, SECOND)["decision"] == "parked"
    mine = b.http.get("/v1/sessions/agent/turns").json()["turns"]
    assert [t["request_id"] for t in mine] == [SECOND]
    assert mine[0]["restored_tokens"] == 0  # not a's restore
    assert len(a.http.get("/v1/sessions/agent/turns").json()["turns"]) == 2


def test_the_stored_events_come_as_server_sent_events_without_following(
    tenant: Callable[[str], Tenant],
) -> None:
    a = tenant("a")
    _two_turns(a)
    events = a.http.get("/v1/events", params={"limit": 100}).json()["events"][::-1]
    answer = a.http.get("/v1/events/stream", params={"after": 0, "follow": "false"})
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    frames = _frames(answer.text)
    assert [int(f["id"]) for f in frames] == [e["id"] for e in events]
    assert [f["data"] for f in frames] == events
    after = events[2]["id"]
    rest = a.http.get("/v1/events/stream", params={"after": after, "follow": "false"})
    assert [int(f["id"]) for f in _frames(rest.text)] == [e["id"] for e in events[3:]]


def _frames(text: str) -> list[dict[str, Any]]:
    import json

    frames = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":")
        )
        if fields:
            fields["data"] = json.loads(fields["data"])
            frames.append(fields)
    return frames


def test_a_parked_turn_names_its_tool_also_when_the_tier_shared_some_blocks() -> None:
    """A pause's detail is ``tool=NAME`` and, when the tier held some of its blocks by
    content, `` shared=N``: the turn's tool is the name alone."""
    from agentpark.store.models import EventRow
    from agentpark.turns import build_turn

    ids = iter(range(1, 100))

    def event(kind: str, detail: str | None, **kw: Any) -> EventRow:
        return EventRow(
            id=next(ids),
            tenant="t",
            session_id="s",
            kind=kind,
            at=1.0,
            detail=detail,
            request_id="r",
            **kw,
        )

    for detail, tool in (("tool=read_file shared=2", "read_file"), ("shared=2", None)):
        turn = build_turn(
            [event("turn", "tokens=32 blocks=2"), event("pause", detail, to_tier="shm", bytes=8)],
            BLOCK,
            4,
        )
        assert (turn.decision, turn.tool, turn.parked_tier) == ("parked", tool, "shm")
