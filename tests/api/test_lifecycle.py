"""The session life cycle over real HTTP against a real uvicorn server."""

from __future__ import annotations

import base64

import numpy as np

from tests.conftest import Daemon


def _logits(body: dict[str, object]) -> np.ndarray:
    raw = body["logits"]
    assert isinstance(raw, str)
    return np.frombuffer(base64.b64decode(raw), dtype="<f4")


def test_pause_resume_continues_bit_exact_like_a_never_paused_twin(daemon: Daemon) -> None:
    c = daemon.client
    prompt = {"prompt": "Search the web for the weather in Lisbon.", "max_new_tokens": 32}
    for sid in ("parked", "twin"):
        assert c.post("/v1/sessions", json={"session_id": sid}).status_code == 201
    first = c.post("/v1/sessions/parked/generate", json=prompt).json()
    twin_first = c.post("/v1/sessions/twin/generate", json=prompt).json()
    assert first["tokens"] == twin_first["tokens"] and len(first["tokens"]) == 32

    host_before = c.get("/v1/host").json()
    session = c.get("/v1/sessions/parked").json()
    blocks, kv_bytes = session["kv_blocks"], session["kv_bytes"]
    assert blocks > 0 and kv_bytes == blocks * host_before["pool"]["block_bytes"]

    paused = c.post("/v1/sessions/parked/pause", json={"tool": "web_search"})
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
    host = c.get("/v1/host").json()
    assert host["pool"]["free_blocks"] == host_before["pool"]["free_blocks"] + blocks
    assert host["pool"]["used_blocks"] == host_before["pool"]["used_blocks"] - blocks
    assert host["tiers"]["dram"]["used_bytes"] == kv_bytes
    assert host["reclaimed_bytes"] == kv_bytes
    assert host["sessions"]["parked"] == 1

    resumed = c.post("/v1/sessions/parked/resume")
    assert resumed.status_code == 200
    assert resumed.json()["restored_from"] == "dram"
    assert c.get("/v1/host").json()["tiers"]["dram"]["used_bytes"] == 0

    more = {"max_new_tokens": 32, "return_logits": True}
    second = c.post("/v1/sessions/parked/generate", json=more).json()
    twin_second = c.post("/v1/sessions/twin/generate", json=more).json()
    assert len(second["tokens"]) == 32
    assert first["tokens"] + second["tokens"] == twin_first["tokens"] + twin_second["tokens"]
    assert _logits(second).tobytes() == _logits(twin_second).tobytes()
    assert second["resumed"] is False


def test_generate_on_a_parked_session_resumes_it_and_says_so(daemon: Daemon) -> None:
    c = daemon.client
    for sid in ("a", "twin"):
        c.post("/v1/sessions", json={"session_id": sid})
        c.post(f"/v1/sessions/{sid}/generate", json={"prompt": "tool call", "max_new_tokens": 8})
    c.post("/v1/sessions/a/pause")
    step = {"prompt": " result: 42", "max_new_tokens": 8, "return_logits": True}
    out = c.post("/v1/sessions/a/generate", json=step).json()
    twin = c.post("/v1/sessions/twin/generate", json=step).json()
    assert out["resumed"] is True and out["restored_from"] == "dram"
    assert out["resume_ms"] is not None and out["resume_ms"] >= 0
    assert out["tokens"] == twin["tokens"]
    assert out["logits"] == twin["logits"]
    assert c.get("/v1/sessions/a").json()["state"] == "active"


def test_pause_and_resume_are_idempotent(daemon: Daemon) -> None:
    c = daemon.client
    c.post("/v1/sessions", json={"session_id": "s"})
    c.post("/v1/sessions/s/generate", json={"prompt": "x", "max_new_tokens": 4})
    again = c.post("/v1/sessions/s/resume")
    assert again.status_code == 200 and again.json()["restored_from"] == "pool"
    c.post("/v1/sessions/s/pause")
    twice = c.post("/v1/sessions/s/pause")
    assert twice.status_code == 200 and twice.json()["state"] == "parked"
    assert c.get("/v1/sessions/s").json()["pause_count"] == 1


def test_events_record_every_transition_with_bytes_and_durations(daemon: Daemon) -> None:
    c = daemon.client
    c.post("/v1/sessions", json={"session_id": "e"})
    c.post("/v1/sessions/e/generate", json={"prompt": "hi", "max_new_tokens": 20})
    c.post("/v1/sessions/e/pause", json={"tool": "code_run"})
    c.post("/v1/sessions/e/resume")
    assert c.delete("/v1/sessions/e").status_code == 204
    events = c.get("/v1/events", params={"session_id": "e"}).json()["events"]
    kinds = [e["kind"] for e in events]
    assert kinds == ["delete", "tool_return", "resume", "pause", "generate", "create"]
    pause = events[3]
    kv_bytes = pause["bytes"]
    assert kv_bytes > 0 and pause["to_tier"] == "dram" and pause["detail"] == "tool=code_run"
    assert events[2]["bytes"] == kv_bytes and events[2]["from_tier"] == "dram"
    assert all(e["duration_ms"] is not None for e in events[1:5])
    assert events[1]["detail"] == "code_run"  # how long the tool took, learned per tool


def test_delete_frees_blocks_and_keeps_the_row_as_history(daemon: Daemon) -> None:
    c = daemon.client
    free0 = c.get("/v1/host").json()["pool"]["free_blocks"]
    c.post("/v1/sessions", json={"session_id": "d"})
    c.post("/v1/sessions/d/generate", json={"prompt": "hello", "max_new_tokens": 40})
    assert c.get("/v1/host").json()["pool"]["free_blocks"] < free0
    assert c.delete("/v1/sessions/d").status_code == 204
    assert c.get("/v1/host").json()["pool"]["free_blocks"] == free0
    assert c.get("/v1/sessions/d").json()["state"] == "deleted"
    assert c.delete("/v1/sessions/d").status_code == 204
    gone = c.post("/v1/sessions/d/generate", json={"prompt": "x", "max_new_tokens": 1})
    assert gone.status_code == 409 and gone.json()["error"]["code"] == "invalid_state"
    listed = [s["session_id"] for s in c.get("/v1/sessions").json()["sessions"]]
    assert "d" not in listed
    deleted = c.get("/v1/sessions", params={"state": "deleted"}).json()["sessions"]
    assert [s["session_id"] for s in deleted] == ["d"]


def test_list_pages_with_a_cursor(daemon: Daemon) -> None:
    c = daemon.client
    ids = [f"s{i}" for i in range(5)]
    for sid in ids:
        c.post("/v1/sessions", json={"session_id": sid})
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = c.get("/v1/sessions", params=params).json()
        seen += [s["session_id"] for s in page["sessions"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids


def test_tenants_cannot_see_or_touch_each_others_sessions(daemon: Daemon) -> None:
    c = daemon.client
    a = {"X-Agentpark-Tenant": "team-a"}
    b = {"X-Agentpark-Tenant": "team-b"}
    c.post("/v1/sessions", json={"session_id": "mine"}, headers=a)
    c.post("/v1/sessions/mine/generate", json={"prompt": "x", "max_new_tokens": 2}, headers=a)
    assert c.get("/v1/sessions/mine", headers=b).status_code == 404
    assert c.post("/v1/sessions/mine/pause", headers=b).status_code == 404
    assert c.delete("/v1/sessions/mine", headers=b).status_code == 404
    assert c.get("/v1/sessions", headers=b).json()["sessions"] == []
    assert c.get("/v1/events", headers=b).json()["events"] == []
    assert c.get("/v1/sessions/mine", headers=a).json()["state"] == "active"
    # the same id in another tenant is another session
    assert c.post("/v1/sessions", json={"session_id": "mine"}, headers=b).status_code == 201


def test_health_readiness_and_openapi(daemon: Daemon) -> None:
    c = daemon.client
    assert c.get("/healthz").json() == {"status": "ok"}
    assert c.get("/readyz").json() == {"status": "ready"}
    spec = c.get("/openapi.json").json()
    assert "/v1/sessions/{session_id}/pause" in spec["paths"]
    assert c.get("/docs").status_code == 200
