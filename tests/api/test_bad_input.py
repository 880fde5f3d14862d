"""Each bad request gets its status and a JSON error, and changes nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from agentpark.config import Settings
from tests.conftest import Daemon, wait_until


def _snapshot(c: httpx.Client, sid: str) -> dict[str, Any]:
    host = c.get("/v1/host").json()
    session = c.get(f"/v1/sessions/{sid}").json()
    session.pop("last_active_at")
    return {"session": session, "pool": host["pool"], "tiers": host["tiers"]}


@pytest.fixture
def warm(daemon: Daemon) -> Daemon:
    """A daemon with session 's' holding 20 tokens of KV."""
    daemon.client.post("/v1/sessions", json={"session_id": "s"})
    daemon.client.post("/v1/sessions/s/generate", json={"prompt": "abc", "max_new_tokens": 17})
    return daemon


def _error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code and error["message"]
    return error


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/sessions/nope"),
        ("DELETE", "/v1/sessions/nope"),
        ("POST", "/v1/sessions/nope/pause"),
        ("POST", "/v1/sessions/nope/resume"),
    ],
)
def test_unknown_session_is_404(warm: Daemon, method: str, path: str) -> None:
    before = _snapshot(warm.client, "s")
    error = _error(warm.client.request(method, path), 404, "session_not_found")
    assert error["details"] == {"session_id": "nope"}
    assert _snapshot(warm.client, "s") == before


def test_generate_unknown_session_is_404(warm: Daemon) -> None:
    r = warm.client.post("/v1/sessions/nope/generate", json={"prompt": "x"})
    _error(r, 404, "session_not_found")


BAD_GENERATE: list[tuple[Any, int, str]] = [
    ({"prompt": "x", "max_new_tokens": 0}, 422, "invalid_request"),
    ({"prompt": "x", "max_new_tokens": "many"}, 422, "invalid_request"),
    ({"prompt": "x", "max_new_tokens": 10_000}, 422, "limit_exceeded"),
    ({"prompt": "x", "temperature": -1}, 422, "invalid_request"),
    ({"prompt": "x", "prompt_tokens": [1]}, 422, "invalid_request"),
    ({"prompt_tokens": [1, 256]}, 422, "invalid_request"),
    ({"prompt_tokens": "abc"}, 422, "invalid_request"),
    ({"prompt": "x", "surprise": True}, 422, "invalid_request"),
    ({"prompt_tokens": [7] * 600, "max_new_tokens": 1}, 422, "limit_exceeded"),
]


@pytest.mark.parametrize(("body", "status", "code"), BAD_GENERATE)
def test_bad_generate_changes_nothing(warm: Daemon, body: Any, status: int, code: str) -> None:
    before = _snapshot(warm.client, "s")
    _error(warm.client.post("/v1/sessions/s/generate", json=body), status, code)
    assert _snapshot(warm.client, "s") == before


def test_prompt_longer_than_the_model_names_the_limit(warm: Daemon) -> None:
    r = warm.client.post("/v1/sessions/s/generate", json={"prompt_tokens": [7] * 600})
    error = _error(r, 422, "limit_exceeded")
    assert error["details"]["max_seq_len"] == 512 and "512" in error["message"]


def test_max_new_tokens_above_the_limit_names_it(warm: Daemon) -> None:
    r = warm.client.post("/v1/sessions/s/generate", json={"prompt": "x", "max_new_tokens": 513})
    error = _error(r, 422, "limit_exceeded")
    assert error["details"]["limit"] == warm.settings.limits.max_new_tokens


def test_malformed_json_is_422(warm: Daemon) -> None:
    before = _snapshot(warm.client, "s")
    r = warm.client.post(
        "/v1/sessions/s/generate",
        content=b'{"prompt": ',
        headers={"content-type": "application/json"},
    )
    error = _error(r, 422, "invalid_request")
    assert error["details"][0]["type"] == "json_invalid"
    assert _snapshot(warm.client, "s") == before


def test_generate_without_any_tokens_is_422(daemon: Daemon) -> None:
    daemon.client.post("/v1/sessions", json={"session_id": "empty"})
    _error(daemon.client.post("/v1/sessions/empty/generate", json={}), 422, "invalid_request")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"tier": "tape"}, "invalid_request"),
        ({"tier": "disk"}, "invalid_request"),
        ({"expected_resume_s": -3}, "invalid_request"),
        ({"tool": 5}, "invalid_request"),
    ],
)
def test_bad_pause_changes_nothing(warm: Daemon, body: dict[str, Any], code: str) -> None:
    before = _snapshot(warm.client, "s")
    _error(warm.client.post("/v1/sessions/s/pause", json=body), 422, code)
    assert _snapshot(warm.client, "s") == before


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"session_id": "s"}, 409, "session_exists"),
        ({"session_id": "has space"}, 422, "invalid_request"),
        ({"session_id": ""}, 422, "invalid_request"),
        ({"session_id": "x" * 129}, 422, "invalid_request"),
        ({"metadata": [1]}, 422, "invalid_request"),
    ],
)
def test_bad_create(warm: Daemon, body: dict[str, Any], status: int, code: str) -> None:
    before = warm.client.get("/v1/sessions").json()
    _error(warm.client.post("/v1/sessions", json=body), status, code)
    assert warm.client.get("/v1/sessions").json() == before


def test_bad_tenant_cursor_and_state_filters_are_422(warm: Daemon) -> None:
    c = warm.client
    _error(c.get("/v1/sessions", headers={"X-Agentpark-Tenant": "a b"}), 422, "invalid_request")
    _error(c.get("/v1/sessions", params={"cursor": "zz"}), 422, "invalid_request")
    _error(c.get("/v1/sessions", params={"state": "sleeping"}), 422, "invalid_request")
    _error(c.get("/v1/sessions", params={"limit": 0}), 422, "invalid_request")
    _error(c.get("/v1/no-such-route"), 404, "not_found")


def test_pool_full_on_generate_is_507_with_the_numbers(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    # No tier to park the idle "hog" into, so making room by pressure is impossible.
    no_tiers = {"dram": {"capacity": 0}, "shm": {"capacity": 0}}
    daemon = daemon_factory(
        make_settings(pool={"num_blocks": 8}, model={"max_seq_len": 128}, tiers=no_tiers)
    )
    c = daemon.client
    c.post("/v1/sessions", json={"session_id": "hog"})
    c.post("/v1/sessions/hog/generate", json={"prompt_tokens": [1] * 90, "max_new_tokens": 6})
    c.post("/v1/sessions", json={"session_id": "s"})
    c.post("/v1/sessions/s/generate", json={"prompt": "hello", "max_new_tokens": 3})
    before = _snapshot(c, "s")
    r = c.post("/v1/sessions/s/generate", json={"prompt": "more", "max_new_tokens": 60})
    error = _error(r, 507, "pool_full")
    assert error["details"] == {
        "needed_blocks": 4,
        "free_blocks": 1,
        "total_blocks": 8,
        "block_bytes": before["pool"]["block_bytes"],
    }
    assert _snapshot(c, "s") == before


def test_prompt_larger_than_the_whole_pool_is_422(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    daemon = daemon_factory(make_settings(pool={"num_blocks": 4}, model={"max_seq_len": 512}))
    daemon.client.post("/v1/sessions", json={"session_id": "s"})
    r = daemon.client.post("/v1/sessions/s/generate", json={"prompt_tokens": [3] * 100})
    error = _error(r, 422, "limit_exceeded")
    assert error["details"]["pool_blocks"] == 4


def test_dram_full_on_pause_is_507_and_the_session_stays_active_and_intact(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    tiers = {"dram": {"capacity": 2 * 4096}, "shm": {"capacity": 1 * 4096}}
    daemon = daemon_factory(make_settings(tiers=tiers))
    c = daemon.client
    for sid in ("s", "twin"):
        c.post("/v1/sessions", json={"session_id": sid})
        c.post(f"/v1/sessions/{sid}/generate", json={"prompt": "a" * 40, "max_new_tokens": 8})
    before = _snapshot(c, "s")
    error = _error(c.post("/v1/sessions/s/pause"), 507, "tier_full")
    assert error["details"] == {
        "needed_blocks": 3,
        "tiers": {
            "dram": {"free_blocks": 2, "capacity_blocks": 2},
            "shm": {"free_blocks": 1, "capacity_blocks": 1},
        },
    }
    assert _snapshot(c, "s") == before
    error = _error(c.post("/v1/sessions/s/pause", json={"tier": "dram"}), 507, "tier_full")
    assert list(error["details"]["tiers"]) == ["dram"]
    assert _snapshot(c, "s") == before
    step = {"max_new_tokens": 8, "return_logits": True}
    out = c.post("/v1/sessions/s/generate", json=step).json()
    twin = c.post("/v1/sessions/twin/generate", json=step).json()
    assert out["tokens"] == twin["tokens"] and out["logits"] == twin["logits"]


def test_pause_while_a_resume_is_in_flight_is_409(daemon: Daemon) -> None:
    c = daemon.client
    c.post("/v1/sessions", json={"session_id": "s"})
    c.post("/v1/sessions/s/generate", json={"prompt": "abc", "max_new_tokens": 5})
    c.post("/v1/sessions/s/pause")
    engine = daemon.runtime.engine
    live = daemon.runtime.parking.live("default", "s")
    results: list[httpx.Response] = []
    with engine.lock:  # the restore copy cannot start until we let go
        resumer = threading.Thread(
            target=lambda: results.append(httpx.post(f"{daemon.url}/v1/sessions/s/resume"))
        )
        resumer.start()
        wait_until(lambda: live.operation == "resume")
        busy = c.post("/v1/sessions/s/pause")
        error = _error(busy, 409, "session_busy")
        assert error["details"]["in_flight"] == "resume"
        _error(c.delete("/v1/sessions/s"), 409, "session_busy")
    resumer.join(timeout=30)
    assert results[0].status_code == 200 and results[0].json()["restored_from"] == "dram"
    assert c.get("/v1/sessions/s").json()["state"] == "active"
