"""Auth on every route: no token (401), another tenant's token (404), no scope (403).

The route table comes from the app itself (``iter_route_contexts``): a new route is
neither open nor guarded until it is added to ``OPEN`` or ``SCOPE`` here, and then the
checks below run on it. Requests go in-process to an app with no loopback default
(``anonymous=False``), except where a test starts a real daemon on 127.0.0.1.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts

from agentpark.app import create_app
from agentpark.auth import Scope
from agentpark.config import Settings
from tests.harness import (
    Daemon,
    InProcessApp,
    TenantClient,
    bearer,
    private_shm_dir,
    run_in_process,
    tiny_settings,
    unset_agentpark_env,
)

SESSION = "/v1/sessions/{session_id}"
TOKEN_RE = re.compile(r"^apk_([0-9a-f]{12})_[A-Za-z0-9_-]{43}$")
# Routes anyone may call: probes, the scrape, the page (its data calls are guarded), docs.
OPEN = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/dashboard"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
}
# Every other route and the one scope it needs.
SCOPE: dict[tuple[str, str], Scope] = {
    ("POST", "/v1/sessions"): Scope.SESSIONS,
    ("GET", "/v1/sessions"): Scope.SESSIONS,
    ("GET", SESSION): Scope.SESSIONS,
    ("DELETE", SESSION): Scope.SESSIONS,
    ("POST", f"{SESSION}/generate"): Scope.SESSIONS,
    ("POST", f"{SESSION}/pause"): Scope.SESSIONS,
    ("POST", f"{SESSION}/resume"): Scope.SESSIONS,
    ("POST", f"{SESSION}/move"): Scope.SESSIONS,
    ("GET", "/v1/events"): Scope.SESSIONS,
    ("GET", "/v1/events/stream"): Scope.SESSIONS,
    ("GET", f"{SESSION}/turns"): Scope.SESSIONS,
    ("GET", "/v1/requests/{request_id}"): Scope.SESSIONS,
    ("GET", "/v1/host"): Scope.OPERATOR,
    ("GET", "/v1/host/history"): Scope.OPERATOR,
    ("GET", "/v1/host/latency"): Scope.OPERATOR,
    ("GET", "/v1/host/parked"): Scope.OPERATOR,
    ("GET", "/v1/peers"): Scope.OPERATOR,
    ("GET", "/v1/vllm"): Scope.SESSIONS,
    ("GET", "/v1/admin/policy"): Scope.OPERATOR,
    ("POST", "/v1/admin/drain"): Scope.ADMIN,
    ("POST", "/v1/admin/reload"): Scope.ADMIN,
    ("GET", "/v1/admin/tokens"): Scope.ADMIN,
    ("POST", "/v1/admin/tokens"): Scope.ADMIN,
    ("DELETE", "/v1/admin/tokens/{token_id}"): Scope.ADMIN,
    ("POST", "/v1/moves"): Scope.ADMIN,
    ("POST", "/v1/moves/drain"): Scope.ADMIN,
    ("POST", "/v1/moves/in"): Scope.ADMIN,
    ("PUT", "/v1/moves/in/{move_id}/blocks"): Scope.ADMIN,
    ("POST", "/v1/moves/in/{move_id}/commit"): Scope.ADMIN,
    ("DELETE", "/v1/moves/in/{move_id}"): Scope.ADMIN,
    ("POST", "/v1/moves/in-batch"): Scope.ADMIN,
    ("POST", "/v1/moves/in-batch/commit"): Scope.ADMIN,
}
# A body each route accepts, so a request that passes the guard is a real one.
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/sessions"): {},
    ("POST", f"{SESSION}/generate"): {"prompt_tokens": [1, 2], "max_new_tokens": 1},
    ("POST", f"{SESSION}/pause"): {"force": True},
    ("POST", f"{SESSION}/move"): {"tier": "shm"},
    ("POST", "/v1/admin/tokens"): {"tenant": "made-by-admin", "scopes": ["sessions"]},
    # A target nobody listens on: the session is not parked (409) or no tenant has any.
    ("POST", "/v1/moves"): {"session_id": "s", "to": "http://127.0.0.1:9", "to_token": "t"},
    ("POST", "/v1/moves/drain"): {"to": "http://127.0.0.1:9", "to_token": "t", "tenant": "-"},
}


@pytest.fixture(scope="module")
def shared_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessApp]:
    """conftest's shared app, with the auth back-off's burst out of reach: this module sends
    hundreds of bad tokens from one address on purpose, and checks each 401 (the back-off
    itself: tests/api/test_auth_limit.py)."""
    with pytest.MonkeyPatch.context() as env, private_shm_dir() as shm:
        unset_agentpark_env(env)
        state = tmp_path_factory.mktemp("auth") / "state"
        settings = tiny_settings(state, shm, auth={"failure_burst": 1_000_000})
        with run_in_process(settings) as running:
            yield running


def routes(app: FastAPI) -> set[tuple[str, str]]:
    """(method, path) of every route the app serves (HEAD is GET's)."""
    found = set()
    for context in iter_route_contexts(app.routes):
        for method in getattr(context.original_route, "methods", None) or ():
            if method != "HEAD":
                found.add((method, context.path))
    return found


@pytest.fixture(scope="module")
def route_table(tmp_path_factory: pytest.TempPathFactory) -> set[tuple[str, str]]:
    from agentpark.config import load_settings

    app = create_app(load_settings(state_dir=tmp_path_factory.mktemp("routes")))
    return routes(app)


# Query strings that make a route answer and end (the event stream follows forever).
QUERIES = {("GET", "/v1/events/stream"): "?follow=false"}


def _url(path: str, session_id: str) -> str:
    path = path.replace("{session_id}", session_id).replace("{token_id}", "0123456789ab")
    path = path.replace("{move_id}", "0" * 32)
    return path.replace("{request_id}", "chatcmpl-unknown")


def _call(
    http: httpx.Client,
    route: tuple[str, str],
    session_id: str,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    method, path = route
    url = _url(path, session_id) + QUERIES.get(route, "")
    return http.request(method, url, json=BODIES.get(route), headers=headers)


@pytest.fixture
def http(shared_app: InProcessApp) -> Iterator[httpx.Client]:
    with httpx.Client(base_url="http://in-process", transport=shared_app.transport) as client:
        yield client


def test_every_route_is_either_open_or_guarded_with_one_scope(
    route_table: set[tuple[str, str]],
) -> None:
    assert OPEN.isdisjoint(SCOPE)
    assert route_table == OPEN | set(SCOPE), (
        f"unclassified: {sorted(route_table - OPEN - set(SCOPE))}; "
        f"gone: {sorted(OPEN | set(SCOPE) - route_table)}"
    )


def test_every_guarded_route_without_a_token_is_401_with_a_bearer_challenge(
    route_table: set[tuple[str, str]], http: httpx.Client, shared_app: InProcessApp
) -> None:
    owner = shared_app.client("owner-401")
    owner.create_session("s")
    for route in sorted(route_table - OPEN):
        for headers in (None, {"Authorization": "Basic dXNlcjpwYXNz"}):
            answer = _call(http, route, "s", headers)
            assert answer.status_code == 401, (route, headers, answer.text)
            assert answer.json()["error"]["code"] == "unauthenticated", route
            assert answer.headers["WWW-Authenticate"].startswith("Bearer "), route
    # The session is as it was: no refused request changed anything.
    assert owner.get_session("s").state == "active"
    assert owner.get_session("s").num_tokens == 0


def test_every_guarded_route_refuses_an_unknown_or_malformed_token(
    route_table: set[tuple[str, str]], http: httpx.Client, shared_app: InProcessApp
) -> None:
    real = shared_app.token("real")
    forged = real[:-4] + ("AAAA" if not real.endswith("AAAA") else "BBBB")  # right id, bad secret
    for route in sorted(route_table - OPEN):
        for token in (forged, "apk_nothex_x", "not-a-token"):
            answer = _call(http, route, "s", bearer(token))
            assert answer.status_code == 401, (route, token, answer.text)
            challenge = answer.headers["WWW-Authenticate"]
            assert 'error="invalid_token"' in challenge, (route, challenge)


def test_every_guarded_route_without_its_scope_is_403(
    route_table: set[tuple[str, str]], http: httpx.Client, shared_app: InProcessApp
) -> None:
    owner = shared_app.client("scoped", "sessions,operator,admin")
    owner.create_session("s")
    for route in sorted(route_table - OPEN):
        needed = SCOPE[route]
        others = ",".join(s.value for s in Scope if s != needed)
        token = shared_app.token("scoped", others)
        answer = _call(http, route, "s", bearer(token))
        assert answer.status_code == 403, (route, answer.text)
        error = answer.json()["error"]
        assert error["code"] == "insufficient_scope"
        assert error["details"]["scope"] == needed.value
        assert f'scope="{needed.value}"' in answer.headers["WWW-Authenticate"]
    assert owner.get_session("s").num_tokens == 0


def test_every_guarded_route_passes_with_its_scope(
    route_table: set[tuple[str, str]], http: httpx.Client, shared_app: InProcessApp
) -> None:
    """The guard lets the right token through to the route itself (whose own answer, e.g.
    409 for resuming an active session, is its business). The admin routes change the
    shared app (drain stops it, reload resets its policy): tested on their own daemons."""
    admin = {("POST", "/v1/admin/drain"), ("POST", "/v1/admin/reload")}
    for route in sorted(route_table - OPEN - admin):
        owner = shared_app.client("passes", SCOPE[route].value)
        session = shared_app.client("passes").create_session().session_id
        answer = _call(http, route, session, bearer(owner.token))
        assert answer.status_code not in (400, 401, 403), (route, answer.text)
        assert answer.status_code < 500, (route, answer.text)


def test_the_tenant_header_is_refused_with_400_naming_it(
    route_table: set[tuple[str, str]], http: httpx.Client, shared_app: InProcessApp
) -> None:
    token = shared_app.token("header", "sessions,operator,admin")
    for route in sorted(route_table - OPEN):
        headers = {**bearer(token), "X-Agentpark-Tenant": "someone-else"}
        answer = _call(http, route, "s", headers)
        assert answer.status_code == 400, (route, answer.text)
        error = answer.json()["error"]
        assert error["code"] == "tenant_header_refused"
        assert "X-Agentpark-Tenant" in error["message"]


def test_another_tenants_token_sees_404_and_never_the_sessions_data(
    route_table: set[tuple[str, str]], http: httpx.Client, shared_app: InProcessApp
) -> None:
    owner = shared_app.client("victim")
    owner.create_session("secret-session", metadata={"plan": "the-victims-plan"})
    owner.generate("secret-session", prompt_tokens=[5, 6, 7], max_new_tokens=2)
    intruder = shared_app.client("intruder")
    one_session = [r for r in sorted(route_table) if "{session_id}" in r[1]]
    assert len(one_session) == 7
    for route in one_session:
        answer = _call(http, route, "secret-session", bearer(intruder.token))
        assert answer.status_code == 404, (route, answer.text)
        assert answer.json()["error"]["code"] == "session_not_found"
        assert "the-victims-plan" not in answer.text
    assert intruder.list_sessions().sessions == []
    assert intruder.events().events == []
    events = http.get("/v1/events?session_id=secret-session", headers=bearer(intruder.token))
    assert events.json()["events"] == []
    # The owner's session is untouched, and the intruder can use the same id for its own.
    assert owner.get_session("secret-session").num_tokens == 5
    assert intruder.create_session("secret-session").tenant == "intruder"


def test_a_revoked_token_is_refused_on_the_next_request(
    shared_app: InProcessApp, http: httpx.Client
) -> None:
    client = shared_app.client("revoked")
    client.create_session("r")
    token_id = client.token.split("_")[1]
    env = {**os.environ, "AGENTPARK_STATE_DIR": str(shared_app.settings.state_dir)}
    # Another process, as an operator would: the running app never hears of it directly.
    done = subprocess.run(
        [sys.executable, "-m", "agentpark", "token", "revoke", token_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answer = http.get("/v1/sessions/r", headers=bearer(client.token))
    assert answer.status_code == 401
    assert answer.json()["error"]["message"] == f"token {token_id} was revoked"


def test_last_use_is_recorded(shared_app: InProcessApp) -> None:
    client = shared_app.client("used")
    token_id = client.token.split("_")[1]
    before = {t.id: t for t in shared_app.app.state.gate.store.entries()}[token_id]
    assert before.last_used_at is None
    client.list_sessions()
    after = {t.id: t for t in shared_app.app.state.gate.store.entries()}[token_id]
    assert after.last_used_at is not None and after.last_used_at >= before.created_at


def test_metrics_health_and_the_page_need_no_token_and_metrics_hold_no_tenant_data(
    shared_app: InProcessApp, http: httpx.Client
) -> None:
    client = shared_app.client("tenant-xq7")
    client.create_session("session-zz9", metadata={"k": "meta-vv3"})
    client.generate("session-zz9", prompt_tokens=[1, 2, 3], max_new_tokens=1)
    client.pause("session-zz9", tool="tool-ww5", force=True)
    for path in ("/healthz", "/readyz", "/dashboard", "/openapi.json"):
        assert http.get(path).status_code == 200, path
    metrics = http.get("/metrics")
    assert metrics.status_code == 200
    assert "agentpark_pauses_total" in metrics.text
    for secret in ("tenant-xq7", "session-zz9", "meta-vv3", "tool-ww5"):
        assert secret not in metrics.text


def test_openapi_lists_the_bearer_scheme_and_401_403_on_every_guarded_route(
    route_table: set[tuple[str, str]], make_settings: Callable[..., Settings]
) -> None:
    spec = create_app(make_settings()).openapi()
    scheme = spec["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for (method, path), operation in (
        ((m.upper(), p), op) for p, item in spec["paths"].items() for m, op in item.items()
    ):
        if (method, path) in OPEN:
            assert "security" not in operation, (method, path)
            continue
        assert {"bearer": []} in operation.get("security", []), (method, path)
        responses = operation["responses"]
        for status, code in (
            ("400", "tenant_header_refused"),
            ("401", "unauthenticated"),
            ("403", "insufficient_scope"),
        ):
            assert status in responses, (method, path, status)
            assert code in responses[status]["description"], (method, path, status)
    documented = {(m.upper(), p) for p, item in spec["paths"].items() for m in item}
    assert set(SCOPE) <= documented


# ---- the drain (admin) and the loopback default, on real daemons ------------------------------


def test_drain_needs_an_admin_token_even_on_loopback(daemon: Daemon) -> None:
    c = daemon.client
    assert c.post("/v1/sessions", json={"session_id": "a"}).status_code == 201  # anonymous
    refused = c.post("/v1/admin/drain")
    assert refused.status_code == 401
    assert "admin" in refused.json()["error"]["message"]
    assert daemon.thread.is_alive()
    operator = daemon.token("ops", "operator")
    assert c.post("/v1/admin/drain", headers=bearer(operator)).status_code == 403
    drained = c.post("/v1/admin/drain", headers=daemon.admin())
    assert drained.status_code == 200, drained.text
    daemon.thread.join(timeout=60)
    assert not daemon.thread.is_alive(), "the drain stops the daemon"


def test_loopback_default_serves_tenant_default_until_a_token_exists(
    daemon: Daemon, tmp_path: Path
) -> None:
    c = daemon.client
    assert c.post("/v1/sessions", json={"session_id": "mine"}).status_code == 201
    assert c.get("/v1/host").status_code == 200
    assert c.get("/v1/sessions/mine").json()["tenant"] == "default"
    # A token made by the CLI (another process) closes the default at the next request.
    env = {**os.environ, "AGENTPARK_STATE_DIR": str(daemon.settings.state_dir)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentpark",
            "token",
            "create",
            "--tenant",
            "default",
            "--scope",
            "sessions",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    assert c.get("/v1/sessions/mine").status_code == 401
    assert c.get("/v1/host").status_code == 401
    mine = c.get("/v1/sessions/mine", headers=bearer(token))
    assert mine.status_code == 200 and mine.json()["tenant"] == "default"


def test_an_in_process_app_with_the_default_and_one_without(
    app_factory: Callable[..., InProcessApp],
    make_settings: Callable[..., Settings],
    tmp_path: Path,
    shm_dir: Path,
) -> None:
    """The choice is the caller's (create_app's ``anonymous``), never the host setting's."""
    closed = app_factory(make_settings(), anonymous=False)
    with httpx.Client(base_url="http://in-process", transport=closed.transport) as http:
        assert http.get("/v1/sessions").status_code == 401
    other = make_settings(state_dir=tmp_path / "open", tiers={"shm": {"path": shm_dir / "open"}})
    opened = app_factory(other, anonymous=True)
    with httpx.Client(base_url="http://in-process", transport=opened.transport) as http:
        assert http.get("/v1/sessions").status_code == 200
        assert http.post("/v1/admin/reload").status_code == 401


def test_peers_are_asked_with_the_callers_token(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    shm_dir: Path,
    tmp_path: Path,
) -> None:
    """One operator token on two hosts (export, then import: the fleet's Secret)."""
    peer = daemon_factory(
        make_settings(state_dir=tmp_path / "peer", tiers={"shm": {"path": shm_dir / "peer"}})
    )
    main = daemon_factory(make_settings(dashboard={"peers": [peer.url], "peer_timeout_s": 5}))
    token = main.token("ops", "operator")
    lines = main.app.state.gate.store.export_lines()
    assert peer.app.state.gate.store.import_lines(lines) == (1, 0)
    answer = main.client.get("/v1/peers", params={"since": -60}, headers=bearer(token))
    assert answer.status_code == 200, answer.text
    hosts = answer.json()["hosts"]
    assert [h["up"] for h in hosts] == [True, True], hosts
    # A token the peer does not know: the peer is down, with the reason.
    other = main.token("ops2", "operator")
    answer = main.client.get("/v1/peers", params={"since": -60}, headers=bearer(other))
    assert [h["up"] for h in answer.json()["hosts"]] == [True, False]
    assert "401" in answer.json()["hosts"][1]["error"]


# ---- tokens over HTTP (admin) ---------------------------------------------------------------


def test_an_admin_creates_lists_and_revokes_tokens_over_http(shared_app: InProcessApp) -> None:
    from typing import get_args

    from agentpark.client import AgentparkAPIError
    from agentpark.schemas.auth import ScopeName

    assert set(get_args(ScopeName)) == {s.value for s in Scope}
    admin = shared_app.client("http-admin", "admin")
    made = admin.create_token("made-over-http", ["sessions"])
    assert TOKEN_RE.match(made.token) and made.token.split("_")[1] == made.id
    assert (made.tenant, made.scopes, made.revoked_at) == ("made-over-http", ["sessions"], None)
    user = TenantClient(
        "http://in-process", made.tenant, made.token, transport=shared_app.transport
    )
    try:
        assert user.create_session("u").tenant == "made-over-http"
        listed = {t.id: t for t in admin.tokens().tokens}
        assert listed[made.id].tenant == "made-over-http"
        assert made.token.split("_", 2)[2] not in admin.request("GET", "/v1/admin/tokens").text
        revoked = admin.revoke_token(made.id)
        assert revoked.revoked_at is not None
        with pytest.raises(AgentparkAPIError) as refused:
            user.get_session("u")
        assert refused.value.status == 401
        assert admin.revoke_token(made.id).revoked_at == revoked.revoked_at  # idempotent
    finally:
        user.close()
    with pytest.raises(AgentparkAPIError) as unknown:
        admin.revoke_token("0123456789ab")
    assert (unknown.value.status, unknown.value.code) == (404, "token_not_found")
    for tenant, scopes in (("a b", ["sessions"]), ("ok", ["root"]), ("ok", [])):
        with pytest.raises(AgentparkAPIError) as bad:
            admin.create_token(tenant, scopes)
        assert (bad.value.status, bad.value.code) == (422, "invalid_request"), (tenant, scopes)
    # The session the revoked token made is still the tenant's (a new token reaches it).
    assert shared_app.client("made-over-http").get_session("u").state == "active"
