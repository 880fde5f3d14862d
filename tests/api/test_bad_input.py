"""Each bad request gets its status and a JSON error, and changes nothing.

Through the in-process app (``app_client``), with the client sending bodies as they are,
so the daemon's own validation is what is tested; the 409 of a request racing a copy in
flight runs against a real server.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from agentpark.client import AgentparkAPIError, AgentparkClient
from agentpark.config import Settings
from agentpark.schemas.sessions import ResumeResponse, SessionOut
from tests.harness import Daemon, InProcessApp, session_row, wait_until


def _snapshot(c: AgentparkClient, sid: str) -> dict[str, Any]:
    host = c.host()
    session = c.get_session(sid).model_dump(exclude={"last_active_at"})
    return {"session": session, "pool": host.pool, "tiers": host.tiers}


@pytest.fixture
def warm(app_client: AgentparkClient) -> AgentparkClient:
    """A client whose tenant has session 's' holding 20 tokens of KV."""
    app_client.create_session("s")
    app_client.generate("s", "abc", max_new_tokens=17)
    return app_client


def _error(call: Callable[[], object], status: int, code: str) -> AgentparkAPIError:
    with pytest.raises(AgentparkAPIError) as raised:
        call()
    error = raised.value
    assert error.status == status, error
    assert error.code == code and error.message
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
def test_unknown_session_is_404(warm: AgentparkClient, method: str, path: str) -> None:
    before = _snapshot(warm, "s")
    error = _error(lambda: warm.request(method, path), 404, "session_not_found")
    assert error.details == {"session_id": "nope"}
    assert _snapshot(warm, "s") == before


def test_generate_unknown_session_is_404(warm: AgentparkClient) -> None:
    _error(lambda: warm.generate("nope", "x"), 404, "session_not_found")


BAD_GENERATE: list[tuple[Any, int, str]] = [
    ({"prompt": "x", "max_new_tokens": 0}, 422, "invalid_request"),
    ({"prompt": "x", "max_new_tokens": "many"}, 422, "invalid_request"),
    ({"prompt": "x", "max_new_tokens": 10_000}, 422, "limit_exceeded"),
    ({"prompt": "x", "temperature": -1}, 422, "invalid_request"),
    ({"prompt": "x", "prompt_tokens": [1]}, 422, "invalid_request"),
    ({"prompt_tokens": [1, 256]}, 422, "invalid_request"),
    ({"prompt_tokens": "abc"}, 422, "invalid_request"),
    ({"prompt": "x", "surprise": True}, 422, "invalid_request"),
    ({"prompt_tokens": [7] * 600, "max_new_tokens": 1}, 409, "context_full"),
]


@pytest.mark.parametrize(("body", "status", "code"), BAD_GENERATE)
def test_bad_generate_changes_nothing(
    warm: AgentparkClient, body: Any, status: int, code: str
) -> None:
    before = _snapshot(warm, "s")
    _error(lambda: warm.request("POST", "/v1/sessions/s/generate", json=body), status, code)
    assert _snapshot(warm, "s") == before


def test_prompt_longer_than_the_model_names_the_limit(warm: AgentparkClient) -> None:
    # 409: a valid body the session cannot hold (its tokens + prompt + max_new_tokens).
    error = _error(lambda: warm.generate("s", prompt_tokens=[7] * 600), 409, "context_full")
    assert error.details["max_seq_len"] == 512 and "512" in error.message


def test_max_new_tokens_above_the_limit_names_it(
    shared_app: InProcessApp, warm: AgentparkClient
) -> None:
    error = _error(lambda: warm.generate("s", "x", max_new_tokens=513), 422, "limit_exceeded")
    assert error.details["limit"] == shared_app.settings.limits.max_new_tokens


def test_malformed_json_is_422(warm: AgentparkClient) -> None:
    before = _snapshot(warm, "s")
    error = _error(
        lambda: warm.request(
            "POST",
            "/v1/sessions/s/generate",
            content=b'{"prompt": ',
            headers={"content-type": "application/json"},
        ),
        422,
        "invalid_request",
    )
    assert error.details[0]["type"] == "json_invalid"
    assert _snapshot(warm, "s") == before


def test_generate_without_any_tokens_is_409(app_client: AgentparkClient) -> None:
    # The body is valid; the session's state (no tokens yet) is what refuses it.
    app_client.create_session("empty")
    _error(lambda: app_client.generate("empty"), 409, "invalid_state")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("generate", {"prompt_tokens": ["1"]}),
        ("generate", {"prompt_tokens": [True]}),
        ("generate", {"max_new_tokens": "2"}),
        ("generate", {"seed": 1.5}),
        ("generate", {"temperature": True}),
        ("generate", {"return_logits": 0}),
        ("pause", {"force": 0}),
        ("pause", {"expected_resume_s": "3"}),
    ],
)
def test_numbers_and_booleans_of_another_json_type_are_422(
    warm: AgentparkClient, path: str, body: dict[str, Any]
) -> None:
    before = _snapshot(warm, "s")
    _error(
        lambda: warm.request("POST", f"/v1/sessions/s/{path}", json=body), 422, "invalid_request"
    )
    assert _snapshot(warm, "s") == before


def test_an_integer_written_with_a_zero_fraction_is_an_integer(warm: AgentparkClient) -> None:
    # JSON Schema's integer includes 2.0; the spec says integer, so it is accepted.
    body = {"prompt_tokens": [1.0, 2], "max_new_tokens": 1.0, "seed": 10090.0}
    assert warm.request("POST", "/v1/sessions/s/generate", json=body).status_code == 200


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"tier": "tape"}, "invalid_request"),
        ({"tier": "disk"}, "invalid_request"),
        ({"expected_resume_s": -3}, "invalid_request"),
        ({"tool": 5}, "invalid_request"),
    ],
)
def test_bad_pause_changes_nothing(warm: AgentparkClient, body: dict[str, Any], code: str) -> None:
    before = _snapshot(warm, "s")
    _error(lambda: warm.request("POST", "/v1/sessions/s/pause", json=body), 422, code)
    assert _snapshot(warm, "s") == before


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
def test_bad_create(warm: AgentparkClient, body: dict[str, Any], status: int, code: str) -> None:
    before = warm.list_sessions()
    _error(lambda: warm.request("POST", "/v1/sessions", json=body), status, code)
    assert warm.list_sessions() == before


def test_bad_cursor_and_state_filters_are_422(warm: AgentparkClient) -> None:
    c = warm
    _error(lambda: c.list_sessions(cursor="zz"), 422, "invalid_request")
    _error(lambda: c.list_sessions(state="sleeping"), 422, "invalid_request")
    _error(lambda: c.list_sessions(limit=0), 422, "invalid_request")
    _error(lambda: c.request("GET", "/v1/no-such-route"), 404, "not_found")


def test_pool_full_on_generate_is_507_with_the_numbers(
    make_settings: Callable[..., Settings], app_factory: Callable[[Settings], InProcessApp]
) -> None:
    # No tier to park the idle "hog" into, so making room by pressure is impossible.
    no_tiers = {"dram": {"capacity": 0}, "shm": {"capacity": 0}}
    # Nothing else runs, so nothing frees blocks: no wait in the admission queue.
    app = app_factory(
        make_settings(
            pool={"num_blocks": 8},
            model={"max_seq_len": 128},
            tiers=no_tiers,
            limits={"admission_timeout_s": 0},
        )
    )
    c = app.client()
    c.create_session("hog")
    c.generate("hog", prompt_tokens=[1] * 90, max_new_tokens=6)
    c.create_session("s")
    c.generate("s", "hello", max_new_tokens=3)
    before = _snapshot(c, "s")
    error = _error(lambda: c.generate("s", "more", max_new_tokens=60), 507, "pool_full")
    assert error.details == {
        "needed_blocks": 4,
        "free_blocks": 1,
        "total_blocks": 8,
        "block_bytes": before["pool"].block_bytes,
        "waited_s": 0.0,
        "retry_after_s": 0.0,
    }
    assert _snapshot(c, "s") == before


def test_prompt_larger_than_the_whole_pool_is_409(
    make_settings: Callable[..., Settings], app_factory: Callable[[Settings], InProcessApp]
) -> None:
    app = app_factory(make_settings(pool={"num_blocks": 4}, model={"max_seq_len": 512}))
    c = app.client()
    c.create_session("s")
    error = _error(lambda: c.generate("s", prompt_tokens=[3] * 100), 409, "context_full")
    assert error.details["pool_blocks"] == 4


def test_dram_full_on_pause_is_507_and_the_session_stays_active_and_intact(
    make_settings: Callable[..., Settings], app_factory: Callable[[Settings], InProcessApp]
) -> None:
    tiers = {"dram": {"capacity": 2 * 4096}, "shm": {"capacity": 1 * 4096}}
    c = app_factory(make_settings(tiers=tiers)).client()
    for sid in ("s", "twin"):
        c.create_session(sid)
        c.generate(sid, "a" * 40, max_new_tokens=8)
    before = _snapshot(c, "s")
    error = _error(lambda: c.pause("s"), 507, "tier_full")
    assert error.details == {
        "needed_blocks": 3,
        "tiers": {
            "dram": {"free_blocks": 2, "capacity_blocks": 2},
            "shm": {"free_blocks": 1, "capacity_blocks": 1},
        },
    }
    assert _snapshot(c, "s") == before
    error = _error(lambda: c.pause("s", tier="dram"), 507, "tier_full")
    assert list(error.details["tiers"]) == ["dram"]
    assert _snapshot(c, "s") == before
    out = c.generate("s", max_new_tokens=8, return_logits=True)
    twin = c.generate("twin", max_new_tokens=8, return_logits=True)
    assert out.tokens == twin.tokens and out.logits == twin.logits


def test_pause_while_a_resume_is_in_flight_is_409(daemon: Daemon) -> None:
    c = AgentparkClient(daemon.url)
    c.create_session("s")
    c.generate("s", "abc", max_new_tokens=5)
    c.pause("s")
    engine = daemon.runtime.engine
    live = daemon.runtime.parking.live("default", "s")
    results: list[ResumeResponse] = []
    with engine.lock:  # the restore copy cannot start until we let go
        resumer = threading.Thread(target=lambda: results.append(c.resume("s")))
        resumer.start()
        wait_until(lambda: live.operation == "resume")
        error = _error(lambda: c.pause("s"), 409, "session_busy")
        assert error.details["in_flight"] == "resume"
        _error(lambda: c.delete_session("s"), 409, "session_busy")
    resumer.join(timeout=30)
    assert results[0].resume_ms is not None and results[0].restored_from == "dram"
    assert c.get_session("s").state == "active"
    c.close()


# ---- input that used to reach a 500, or a 500 after a refusal that stored something -----


def _raw(c: AgentparkClient, method: str, path: str, body: bytes) -> Callable[[], object]:
    """A call that sends ``body`` exactly as given (invalid JSON for Python's json module)."""
    headers = {"content-type": "application/json"}
    return lambda: c.request(method, path, content=body, headers=headers)


def _everything(c: AgentparkClient) -> dict[str, Any]:
    host = c.host()
    sessions = [s.model_dump(exclude={"last_active_at"}) for s in c.list_sessions().sessions]
    return {"sessions": sessions, "pool": host.pool, "tiers": host.tiers}


@pytest.mark.parametrize(
    "body",
    [
        b'{"expected_resume_s": 1e12, "force": true}',
        b'{"expected_resume_s": 1e300, "force": true}',
        b'{"expected_resume_s": Infinity, "force": true}',
        b'{"expected_resume_s": NaN, "force": true}',
        b'{"expected_resume_s": 2592001, "force": true}',
    ],
)
def test_pause_with_an_absurd_expected_resume_s_is_422(warm: AgentparkClient, body: bytes) -> None:
    before = _everything(warm)
    _error(_raw(warm, "POST", "/v1/sessions/s/pause", body), 422, "invalid_request")
    assert _everything(warm) == before
    assert warm.get_session("s").state == "active"


def test_pause_with_thirty_days_expected_is_accepted(warm: AgentparkClient) -> None:
    out = warm.request(
        "POST", "/v1/sessions/s/pause", json={"expected_resume_s": 2_592_000, "force": True}
    )
    assert out.status_code == 200
    assert warm.get_session("s").expected_resume_at is not None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("expected_resume_at", 1e13),
        ("expected_resume_at", float("inf")),
        ("expected_resume_at", float("nan")),
        ("paused_at", -1e300),
        ("created_at", 1e300),
        ("last_active_at", float("nan")),
    ],
)
def test_a_stored_timestamp_out_of_range_is_repaired_on_read(field: str, value: float) -> None:
    # Rows written by older versions (no bound on expected_resume_s) must not 500 on GET.
    row = session_row(
        state="parked", tier="dram", num_tokens=1, kv_blocks=1, kv_bytes=4096, pause_count=1
    )
    row.paused_at, row.meta = 1_700_000_000.0, None
    setattr(row, field, value)
    out = SessionOut.of(row)
    got = getattr(out, field)
    if field in ("created_at", "last_active_at"):  # required: clamped into range
        clamped = {1e300: datetime.max.replace(tzinfo=UTC)}  # NaN: the epoch
        assert got == clamped.get(value, datetime.fromtimestamp(0, UTC))
    else:
        assert got is None
    out.model_dump_json()


@pytest.mark.parametrize(
    "body",
    [
        b'{"session_id": "o2", "metadata": {"x": "\\ud800"}}',
        b'{"session_id": "o2", "metadata": {"\\udfff": 1}}',
        b'{"session_id": "o2", "metadata": {"x": [{"y": ["ok", "\\ud800z"]}]}}',
    ],
)
def test_create_with_a_lone_surrogate_is_422_and_stores_nothing(
    warm: AgentparkClient, body: bytes
) -> None:
    before = _everything(warm)
    error = _error(_raw(warm, "POST", "/v1/sessions", body), 422, "invalid_request")
    assert "surrogate" in error.message
    assert _everything(warm) == before
    _error(lambda: warm.get_session("o2"), 404, "session_not_found")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/sessions/s/generate", b'{"prompt": "\\ud800"}'),
        ("/v1/sessions/s/pause", b'{"tool": "\\ud800", "force": true}'),
    ],
)
def test_a_lone_surrogate_in_a_prompt_or_tool_is_422(
    warm: AgentparkClient, path: str, body: bytes
) -> None:
    before = _everything(warm)
    _error(_raw(warm, "POST", path, body), 422, "invalid_request")
    assert _everything(warm) == before


def test_stored_metadata_with_a_lone_surrogate_is_repaired_on_read() -> None:
    row = session_row(
        tool="t\ud800",
        meta={"x\udfff": ["\ud800", {"y": "ok"}]},
    )
    out = SessionOut.of(row)
    assert out.metadata == {"x\ufffd": ["\ufffd", {"y": "ok"}]}
    assert out.tool == "t\ufffd"
    out.model_dump_json().encode("utf-8")


@pytest.mark.parametrize(
    "cursor", ["99999999999999999999999", "9223372036854775808", "\u00b2", "-1", "1.5"]
)
def test_a_cursor_out_of_range_is_422(warm: AgentparkClient, cursor: str) -> None:
    before = _everything(warm)
    _error(lambda: warm.list_sessions(cursor=cursor), 422, "invalid_request")
    assert _everything(warm) == before


@pytest.mark.parametrize(
    "query",
    ["since=inf", "since=nan", "since=-inf", "until=inf", "until=nan", "since=0&until=nan"],
)
def test_history_window_must_be_finite(warm: AgentparkClient, query: str) -> None:
    _error(lambda: warm.request("GET", f"/v1/host/history?{query}"), 422, "invalid_request")


@pytest.mark.parametrize("query", ["since=nan", "step=nan", "since=inf"])
def test_peers_window_must_be_finite(warm: AgentparkClient, query: str) -> None:
    _error(lambda: warm.request("GET", f"/v1/peers?{query}"), 422, "invalid_request")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"session_id": "o3", "metadata": {"x": "\xff\xfe"}}', "UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested"),
    ],
)
def test_an_undecodable_or_too_deep_body_is_422(
    warm: AgentparkClient, body: bytes, words: str
) -> None:
    before = _everything(warm)
    error = _error(_raw(warm, "POST", "/v1/sessions", body), 422, "invalid_request")
    assert words in error.message
    assert _everything(warm) == before


def test_a_body_over_max_body_bytes_is_413(shared_app: InProcessApp, warm: AgentparkClient) -> None:
    limit = shared_app.settings.limits.max_body_bytes
    before = _everything(warm)
    body = b'{"prompt": "' + b"a" * limit + b'"}'
    error = _error(_raw(warm, "POST", "/v1/sessions/s/generate", body), 413, "payload_too_large")
    assert error.details["max_body_bytes"] == limit and str(limit) in error.message
    assert _everything(warm) == before


def test_a_chunked_body_over_max_body_bytes_is_413(
    shared_app: InProcessApp, warm: AgentparkClient
) -> None:
    limit = shared_app.settings.limits.max_body_bytes

    def chunks() -> Iterator[bytes]:
        yield b'{"session_id": "big", "metadata": {"x": "'
        for _ in range(limit // 65_536 + 1):
            yield b"a" * 65_536
        yield b'"}}'

    before = _everything(warm)
    headers = {"content-type": "application/json"}
    call = lambda: warm.request("POST", "/v1/sessions", content=chunks(), headers=headers)  # noqa: E731
    _error(call, 413, "payload_too_large")
    assert _everything(warm) == before


def test_metadata_over_max_metadata_bytes_is_413(
    shared_app: InProcessApp, warm: AgentparkClient
) -> None:
    limit = shared_app.settings.limits.max_metadata_bytes
    before = _everything(warm)
    body = {"session_id": "big", "metadata": {"x": "a" * limit}}
    error = _error(
        lambda: warm.request("POST", "/v1/sessions", json=body), 413, "payload_too_large"
    )
    assert error.details["max_metadata_bytes"] == limit
    assert _everything(warm) == before
    _error(lambda: warm.get_session("big"), 404, "session_not_found")
    small = {"session_id": "ok", "metadata": {"x": "a" * (limit // 2)}}
    assert warm.request("POST", "/v1/sessions", json=small).status_code == 201
