"""The session life cycle through the REST API: in-process, and once over real HTTP."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import numpy as np
import pytest

from agentpark.client import AgentparkAPIError, AgentparkClient
from agentpark.schemas.sessions import GenerateResponse
from tests.harness import Daemon, InProcessApp


def _logits(body: GenerateResponse) -> np.ndarray:
    raw = body.logits
    assert isinstance(raw, str)
    return np.frombuffer(base64.b64decode(raw), dtype="<f4")


@pytest.fixture(params=["in-process", "uvicorn"])
def any_client(request: pytest.FixtureRequest) -> Iterator[AgentparkClient]:
    """The shared in-process app, then a real uvicorn server on a loopback port."""
    if request.param == "in-process":
        yield request.getfixturevalue("app_client")
    else:
        daemon: Daemon = request.getfixturevalue("daemon")
        with AgentparkClient(daemon.url) as client:
            yield client


def test_pause_resume_continues_bit_exact_like_a_never_paused_twin(
    any_client: AgentparkClient,
) -> None:
    c = any_client
    prompt = "Search the web for the weather in Lisbon."
    for sid in ("parked", "twin"):
        assert c.request("POST", "/v1/sessions", json={"session_id": sid}).status_code == 201
    first = c.generate("parked", prompt, max_new_tokens=32)
    twin_first = c.generate("twin", prompt, max_new_tokens=32)
    assert first.tokens == twin_first.tokens and len(first.tokens) == 32

    host_before = c.host()
    session = c.get_session("parked")
    blocks, kv_bytes = session.kv_blocks, session.kv_bytes
    assert blocks > 0 and kv_bytes == blocks * host_before.pool.block_bytes

    paused = c.request("POST", "/v1/sessions/parked/pause", json={"tool": "web_search"})
    assert paused.status_code == 200
    assert paused.json() | {"pause_ms": 0} == {
        "session_id": "parked",
        "decision": "parked",
        "why": "no expected pause duration (tool web_search never seen and has no prior): "
        "parking frees the pool",
        "expected_pause_s": None,
        "state": "parked",
        "tier": "dram",
        "kv_bytes": kv_bytes,
        "pause_ms": 0,
    }
    host = c.host()
    assert host.pool.free_blocks == host_before.pool.free_blocks + blocks
    assert host.pool.used_blocks == host_before.pool.used_blocks - blocks
    assert host.tiers["dram"].used_bytes == kv_bytes
    assert host.reclaimed_bytes == kv_bytes
    assert host.sessions["parked"] == 1

    resumed = c.resume("parked")
    assert resumed.resume_ms is not None  # 200, done: not 202 with the copy in flight
    assert resumed.restored_from == "dram"
    assert c.host().tiers["dram"].used_bytes == 0

    second = c.generate("parked", max_new_tokens=32, return_logits=True)
    twin_second = c.generate("twin", max_new_tokens=32, return_logits=True)
    assert len(second.tokens) == 32
    assert first.tokens + second.tokens == twin_first.tokens + twin_second.tokens
    assert _logits(second).tobytes() == _logits(twin_second).tobytes()
    assert second.resumed is False


def test_generate_on_a_parked_session_resumes_it_and_says_so(app_client: AgentparkClient) -> None:
    c = app_client
    for sid in ("a", "twin"):
        c.create_session(sid)
        c.generate(sid, "tool call", max_new_tokens=8)
    c.pause("a")
    step = {"max_new_tokens": 8, "return_logits": True}
    out = c.generate("a", " result: 42", **step)
    twin = c.generate("twin", " result: 42", **step)
    assert out.resumed is True and out.restored_from == "dram"
    assert out.resume_ms is not None and out.resume_ms >= 0
    assert out.tokens == twin.tokens
    assert out.logits == twin.logits
    assert c.get_session("a").state == "active"


def test_pause_and_resume_are_idempotent(app_client: AgentparkClient) -> None:
    c = app_client
    c.create_session("s")
    c.generate("s", "x", max_new_tokens=4)
    again = c.request("POST", "/v1/sessions/s/resume")
    assert again.status_code == 200 and again.json()["restored_from"] == "pool"
    c.pause("s")
    twice = c.request("POST", "/v1/sessions/s/pause")
    assert twice.status_code == 200 and twice.json()["state"] == "parked"
    assert c.get_session("s").pause_count == 1


def test_events_record_every_transition_with_bytes_and_durations(
    app_client: AgentparkClient,
) -> None:
    c = app_client
    c.create_session("e")
    c.generate("e", "hi", max_new_tokens=20)
    c.pause("e", tool="code_run")
    c.resume("e")
    assert c.request("DELETE", "/v1/sessions/e").status_code == 204
    events = c.events("e").events
    kinds = [e.kind for e in events]
    assert kinds == ["delete", "tool_return", "resume", "pause", "generate", "create"]
    pause = events[3]
    kv_bytes = pause.bytes
    assert kv_bytes is not None
    assert kv_bytes > 0 and pause.to_tier == "dram" and pause.detail == "tool=code_run"
    assert events[2].bytes == kv_bytes and events[2].from_tier == "dram"
    assert all(e.duration_ms is not None for e in events[1:5])
    assert events[1].detail == "code_run"  # how long the tool took, learned per tool


def test_delete_frees_blocks_and_keeps_the_row_as_history(app_client: AgentparkClient) -> None:
    c = app_client
    free0 = c.host().pool.free_blocks
    c.create_session("d")
    c.generate("d", "hello", max_new_tokens=40)
    assert c.host().pool.free_blocks < free0
    assert c.request("DELETE", "/v1/sessions/d").status_code == 204
    assert c.host().pool.free_blocks == free0
    with pytest.raises(AgentparkAPIError) as deleted:  # its history: the events
        c.get_session("d")
    assert deleted.value.status == 404
    assert c.request("DELETE", "/v1/sessions/d").status_code == 204
    with pytest.raises(AgentparkAPIError) as gone:
        c.generate("d", "x", max_new_tokens=1)
    assert gone.value.status == 409 and gone.value.code == "invalid_state"
    listed = [s.session_id for s in c.list_sessions().sessions]
    assert "d" not in listed
    deleted = c.list_sessions(state="deleted").sessions
    assert [s.session_id for s in deleted] == ["d"]


def test_list_pages_with_a_cursor(app_client: AgentparkClient) -> None:
    c = app_client
    ids = [f"s{i}" for i in range(5)]
    for sid in ids:
        c.create_session(sid)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = c.list_sessions(limit=2, cursor=cursor)
        pages += 1
        seen += [s.session_id for s in page.sessions]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == ids and pages == 3
    assert [s.session_id for s in c.iter_sessions(page_size=2)] == ids


def test_tenants_cannot_see_or_touch_each_others_sessions(
    shared_app: InProcessApp, app_client: AgentparkClient
) -> None:
    a = shared_app.client(f"{app_client.tenant}-a")
    b = shared_app.client(f"{app_client.tenant}-b")
    a.create_session("mine")
    a.generate("mine", "x", max_new_tokens=2)
    for call in (
        lambda: b.get_session("mine"),
        lambda: b.pause("mine"),
        lambda: b.delete_session("mine"),
    ):
        with pytest.raises(AgentparkAPIError) as refused:
            call()
        assert refused.value.status == 404
    assert b.list_sessions().sessions == []
    assert b.events().events == []
    assert a.get_session("mine").state == "active"
    # the same id in another tenant is another session
    assert b.request("POST", "/v1/sessions", json={"session_id": "mine"}).status_code == 201


def test_health_readiness_and_openapi(app_client: AgentparkClient) -> None:
    c = app_client
    assert c.healthz().status == "ok"
    assert c.request("GET", "/readyz").json() == {"status": "ready"}
    assert c.readyz() is True
    spec = c.request("GET", "/openapi.json").json()
    assert "/v1/sessions/{session_id}/pause" in spec["paths"]
    assert c.request("GET", "/docs").status_code == 200
