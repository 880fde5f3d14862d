"""agentpark.client against a real uvicorn daemon, and its wire format against a stub."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable

import httpx
import pytest

from agentpark.client import AgentparkAPIError, AgentparkClient, AsyncAgentparkClient
from agentpark.config import Settings
from agentpark.schemas.sessions import SessionOut
from agentpark.snapshot import HostSnapshot
from tests.harness import Daemon, settled, wait_until


def test_a_session_life_cycle_through_the_client(daemon: Daemon) -> None:
    token = daemon.token("orchestrator", "sessions,operator,admin")
    with AgentparkClient(daemon.url, token=token) as ap:
        assert ap.healthz().status == "ok" and ap.readyz() is True
        created = ap.create_session("agent-1", metadata={"task": "trip planning"})
        assert isinstance(created, SessionOut)
        assert (created.session_id, created.tenant, created.state) == (
            "agent-1",
            "orchestrator",
            "active",
        )
        assert created.metadata == {"task": "trip planning"}
        assert ap.create_session().session_id  # the daemon names it

        out = ap.generate("agent-1", "Find flights to Lisbon.", max_new_tokens=8)
        assert len(out.tokens) == 8 and out.resumed is False
        assert out.num_tokens == ap.get_session("agent-1").num_tokens
        by_ids = ap.generate("agent-1", prompt_tokens=(1, 2, 3), max_new_tokens=2)
        assert by_ids.num_tokens == out.num_tokens + 3 + 2

        paused = ap.pause("agent-1", tool="web_search", expected_resume_s=3600, force=True)
        assert (paused.decision, paused.state, paused.tier) == ("parked", "parked", "dram")
        assert paused.expected_pause_s == 3600 and paused.pause_ms is not None
        host = ap.host()
        assert isinstance(host, HostSnapshot)
        assert host.reclaimed_bytes == paused.kv_bytes > 0
        assert host.tiers["dram"].used_bytes == paused.kv_bytes

        moved = ap.move("agent-1", "shm")
        assert (moved.from_tier, moved.tier, moved.state) == ("dram", "shm", "parked")
        resumed = ap.resume("agent-1")
        assert (resumed.state, resumed.restored_from) == ("active", "shm")
        assert resumed.resume_ms is not None

        events = ap.events("agent-1", limit=4).events
        assert [e.kind for e in events] == ["tool_return", "resume", "move", "pause"]
        assert events[3].detail == "tool=web_search" and events[3].bytes == paused.kv_bytes

        policy = ap.policy()
        assert policy.policy.idle_pause_after_s == 0 and policy.bandwidth_bps > 0

        ap.delete_session("agent-1")
        with pytest.raises(AgentparkAPIError) as deleted:
            ap.get_session("agent-1")
        assert deleted.value.status == 404
        ap.delete_session("agent-1")  # idempotent


def test_pause_without_waiting_answers_at_once(daemon: Daemon) -> None:
    with AgentparkClient(daemon.url) as ap:
        ap.create_session("s")
        ap.generate("s", "abc", max_new_tokens=20)
        paused = ap.pause("s", force=True, wait=False)
        assert paused.pause_ms is None and paused.state in ("pausing", "parked")
        wait_until(lambda: settled(daemon, "s", "parked"))
        resumed = ap.resume("s", wait=False)
        assert resumed.resume_ms is None
        wait_until(lambda: settled(daemon, "s", "active"))


def test_list_pages_and_iter_sessions_walks_every_page(daemon: Daemon) -> None:
    with AgentparkClient(daemon.url, token=daemon.token("pages", "sessions")) as ap:
        ids = [f"s{i}" for i in range(5)]
        for sid in ids:
            ap.create_session(sid)
        first = ap.list_sessions(limit=2)
        assert [s.session_id for s in first.sessions] == ids[:2]
        assert first.next_cursor is not None
        second = ap.list_sessions(limit=2, cursor=first.next_cursor)
        assert [s.session_id for s in second.sessions] == ids[2:4]
        assert [s.session_id for s in ap.iter_sessions(page_size=2)] == ids
        assert [s.session_id for s in ap.iter_sessions()] == ids
        ap.delete_session("s1")
        assert [s.session_id for s in ap.iter_sessions(page_size=1)] == ids[:1] + ids[2:]
        deleted = ap.iter_sessions(state="deleted", page_size=1)
        assert [s.session_id for s in deleted] == ["s1"]
    with AgentparkClient(daemon.url, token=daemon.token("someone-else", "sessions")) as other:
        assert list(other.iter_sessions()) == []


def test_errors_carry_the_status_code_and_details_of_the_envelope(daemon: Daemon) -> None:
    with AgentparkClient(daemon.url) as ap:
        with pytest.raises(AgentparkAPIError) as missing:
            ap.get_session("nope")
        assert (missing.value.status, missing.value.code) == (404, "session_not_found")
        assert missing.value.details == {"session_id": "nope"}
        assert "404 session_not_found" in str(missing.value)

        ap.create_session("s")
        ap.generate("s", "abc", max_new_tokens=4)
        with pytest.raises(AgentparkAPIError) as bad_tier:
            ap.pause("s", tier="tape")
        assert (bad_tier.value.status, bad_tier.value.code) == (422, "invalid_request")
        assert "tier" in bad_tier.value.message
        with pytest.raises(AgentparkAPIError) as bad_move:
            ap.move("s", "tape")
        assert bad_move.value.status == 422
        with pytest.raises(AgentparkAPIError) as exists:
            ap.create_session("s")
        assert (exists.value.status, exists.value.code) == (409, "session_exists")
        assert ap.get_session("s").state == "active"  # refused input changed nothing


def test_the_async_client_makes_the_same_calls(daemon: Daemon) -> None:
    token = daemon.token("async")

    async def drive() -> list[str]:
        async with AsyncAgentparkClient(daemon.url, token=token) as ap:
            assert await ap.readyz() is True
            for sid in ("a", "b", "c"):
                await ap.create_session(sid)
            out = await ap.generate("a", "hello", max_new_tokens=6)
            assert len(out.tokens) == 6
            paused = await ap.pause("a", force=True)
            assert paused.state == "parked"
            assert (await ap.host()).reclaimed_bytes == paused.kv_bytes
            moved = await ap.move("a", "shm")
            assert moved.tier == "shm"
            resumed = await ap.resume("a")
            assert resumed.restored_from == "shm"
            kinds = [e.kind for e in (await ap.events("a")).events]
            assert kinds == ["resume", "move", "pause", "generate", "create"]
            with pytest.raises(AgentparkAPIError) as missing:
                await ap.get_session("nope")
            assert (missing.value.status, missing.value.code) == (404, "session_not_found")
            with pytest.raises(AgentparkAPIError) as bad_tier:
                await ap.pause("a", tier="tape")
            assert bad_tier.value.status == 422
            await ap.delete_session("c")
            return [s.session_id async for s in ap.iter_sessions(page_size=1)]

    assert asyncio.run(drive()) == ["a", "b"]


def test_drain_through_the_client_parks_everything_and_stops_the_daemon(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    daemon = daemon_factory(make_settings())
    with AgentparkClient(daemon.url) as ap:  # the loopback default: tenant default
        ap.create_session("s")
        ap.generate("s", "abc", max_new_tokens=4)
        with pytest.raises(AgentparkAPIError) as refused:
            ap.drain()  # admin needs a token, even on loopback
        assert refused.value.status == 401
    with AgentparkClient(daemon.url, token=daemon.token("ops", "admin")) as ap:
        summary = ap.drain()
    assert (summary.parked, summary.moved, summary.lost) == (1, 0, 0)
    daemon.thread.join(timeout=60)
    assert not daemon.thread.is_alive()


# ---- the wire format, against a stub transport (no daemon) ------------------------------


def _stub(
    answer: Callable[[httpx.Request], httpx.Response], seen: list[httpx.Request]
) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer(request)

    return httpx.MockTransport(handle)


def test_the_token_header_is_sent_and_unset_fields_are_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[httpx.Request] = []
    answer = {
        "session_id": "s",
        "decision": "kept",
        "why": "short",
        "expected_pause_s": 1.0,
        "state": "active",
        "tier": None,
        "kv_bytes": 0,
        "pause_ms": 0.0,
    }
    transport = _stub(lambda _r: httpx.Response(200, json=answer), seen)
    with AgentparkClient("http://stub", token="secret", transport=transport) as ap:
        assert ap.pause("a/b", tool="code_run", wait=False).decision == "kept"
    with AgentparkClient("http://stub", transport=transport) as anonymous:
        anonymous.pause("s", tier="shm", expected_resume_s=0)
    monkeypatch.setenv("AGENTPARK_TOKEN", "from-env")
    with AgentparkClient("http://stub", transport=transport) as from_env:
        from_env.pause("s")
    with AgentparkClient("http://stub", token="given", transport=transport) as given:
        given.pause("s")
    first, second, third, fourth = seen
    assert "X-Agentpark-Tenant" not in first.headers  # the tenant is the token's
    assert first.headers["Authorization"] == "Bearer secret"
    assert third.headers["Authorization"] == "Bearer from-env"
    assert fourth.headers["Authorization"] == "Bearer given"
    assert first.url.raw_path == b"/v1/sessions/a%2Fb/pause?wait=false"
    assert json.loads(first.content) == {"tool": "code_run"}  # the daemon's defaults apply
    assert "X-Agentpark-Tenant" not in second.headers and "Authorization" not in second.headers
    assert json.loads(second.content) == {"expected_resume_s": 0, "tier": "shm"}
    assert second.url.params["wait"] == "true"


@pytest.mark.parametrize(
    ("response", "status", "code"),
    [
        (httpx.Response(502, text="<html>Bad Gateway</html>"), 502, "http_error"),
        (httpx.Response(500, json={"detail": "not our envelope"}), 500, "http_error"),
        (httpx.Response(200, text="not json"), 200, "invalid_response"),
        (httpx.Response(200, json={"session_id": 1}), 200, "invalid_response"),
    ],
)
def test_an_answer_that_is_not_ours_still_raises_a_clear_error(
    response: httpx.Response, status: int, code: str
) -> None:
    ap = AgentparkClient("http://stub", transport=_stub(lambda _r: response, []))
    with ap, pytest.raises(AgentparkAPIError) as raised:
        ap.get_session("s")
    assert (raised.value.status, raised.value.code) == (status, code)
    assert raised.value.message
    if status == 502:
        assert "Bad Gateway" in raised.value.message


def test_readyz_is_false_while_warming_up_and_other_errors_raise() -> None:
    warming = {"error": {"code": "not_ready", "message": "the engine is still warming up"}}
    stub = _stub(lambda _r: httpx.Response(503, json=warming), [])
    with AgentparkClient("http://stub", transport=stub) as ap:
        assert ap.readyz() is False
        with pytest.raises(AgentparkAPIError) as raised:
            ap.host()
        assert (raised.value.status, raised.value.code) == (503, "not_ready")


def test_the_client_loads_none_of_the_daemon() -> None:
    # The client and the API share agentpark.schemas, a floor below both: importing the
    # client loads no API module, no web server, no store and no engine.
    probe = (
        "import sys, agentpark.client; print(sorted(m for m in sys.modules if m.startswith("
        "('agentpark.api', 'agentpark.store', 'agentpark.parking', 'agentpark.runtime', "
        "'fastapi', 'starlette', 'sqlalchemy', 'jax'))))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
