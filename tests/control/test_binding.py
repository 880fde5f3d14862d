"""Who a control connection is, and whose plans it may finish (agentpark.control.handlers).

The tenant is the token's, presented once in ``hello`` and checked as REST checks a
bearer token; a plan is finished only by the connection that made it (or one of the same
engine: ``peer``); a closed connection's plans are failed at once.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentpark.auth import Scope
from agentpark.connectors.client import ControlClient
from agentpark.connectors.protocol import encode_tokens
from agentpark.enums import State
from tests.connectors.conftest import ControlDaemon
from tests.control.harness import Raw, state
from tests.control.test_control import BLOCK, Worker, _register
from tests.harness import wait_until

TOKENS = list(range(1, 2 * BLOCK + 1))


def _token(daemon: ControlDaemon, tenant: str, *scopes: Scope) -> str:
    token, _ = daemon.service.gate.store.create(tenant, scopes or (Scope.SESSIONS,))
    return token


def _prepare(conn: Raw, session_id: str, tokens: list[int] = TOKENS) -> dict[str, Any]:
    frame = {"op": "prepare_store", "session_id": session_id, "block_ids": [1, 2]}
    answer = conn.send(
        {**frame, "tool": "search", "expected_resume_s": 60.0}, encode_tokens(tokens)
    )
    assert answer["ok"] and answer["decision"] == "parked", answer
    return answer


def _complete(conn: Raw, worker: Worker, plan: dict[str, Any]) -> dict[str, Any]:
    worker.write(plan["slots"], seed=plan["store_id"])
    digests = worker.digests(plan["slots"])
    frame = {"op": "complete_store", "store_id": plan["store_id"], "ok": True}
    return conn.send({**frame, "digests": digests})


def _begin_load(conn: Raw, session_id: str) -> dict[str, Any]:
    frame = {"op": "begin_load", "session_id": session_id, "start_block": 0, "block_ids": [5, 6]}
    return conn.send(frame, encode_tokens([*TOKENS, 1]))


@pytest.fixture
def worker(control_daemon: ControlDaemon) -> Worker:
    return _register(control_daemon)[1]


def test_hello_checks_the_token_as_rest_does(control_daemon: ControlDaemon) -> None:
    daemon, path = control_daemon, control_daemon.service.socket_path
    anonymous = Raw(path)
    assert anonymous.hello()["tenant"] == "default"  # loopback, no token in the database
    alpha = _token(daemon, "alpha")
    operator = _token(daemon, "ops", Scope.OPERATOR)
    revoked = _token(daemon, "gone")
    daemon.service.gate.store.revoke(revoked.split("_")[1])
    for token, cause in (
        (None, "unauthenticated"),  # a token exists now: the loopback default is over
        ("apk_000000000000_" + "A" * 43, "unauthenticated"),
        ("not-a-token", "unauthenticated"),
        (revoked, "unauthenticated"),
        (operator, "insufficient_scope"),
    ):
        conn = Raw(path)
        frame = {"op": "hello"} if token is None else {"op": "hello", "token": token}
        answer = conn.send(frame)
        assert answer["ok"] is False and answer["cause"] == cause, (token, answer)
        refused = conn.send({"op": "match", "session_id": "s", "num_computed": 0})
        assert refused["cause"] == "unauthenticated"  # a failed hello authenticates nothing
        conn.close()
    conn = Raw(path)
    assert conn.hello(alpha)["tenant"] == "alpha"
    again = conn.send({"op": "hello", "token": alpha})
    assert again["ok"] is False and again["cause"] == "bad_request"  # once per connection
    conn.close()
    anonymous.close()


def test_a_frame_naming_another_tenant_acts_on_the_connections_tenant_only(
    control_daemon: ControlDaemon, worker: Worker
) -> None:
    daemon, path = control_daemon, control_daemon.service.socket_path
    alpha, beta = Raw(path), Raw(path)
    alpha.hello(_token(daemon, "alpha"))
    beta.hello(_token(daemon, "beta"))
    assert _complete(alpha, worker, _prepare(alpha, "s"))["decision"] == "parked"
    core = daemon.service.driver.core
    assert core.get("alpha", "s").state == State.PARKED
    before = state(daemon)
    named = {"op": "match", "session_id": "s", "num_computed": 0, "tenant": "alpha"}
    answer = beta.send(named, encode_tokens([*TOKENS, 1]))
    assert answer["cause"] == "bad_request" and "tenant" in answer["error"]
    answer = beta.send({**named, "op": "begin_load", "start_block": 0, "block_ids": [5, 6]})
    assert answer["cause"] == "bad_request" and state(daemon) == before
    # Without the field, beta's frames act on beta's sessions: alpha's is not there.
    frame = {"op": "match", "session_id": "s", "num_computed": 0}
    assert beta.send(frame, encode_tokens([*TOKENS, 1]))["tokens"] == 0
    assert _begin_load(beta, "s")["ok"] is False
    # The real client drops a tenant its caller names: its token's tenant acts.
    client = ControlClient(None, socket_path=str(path), token=_token(daemon, "gamma"))
    answer = client.call(
        "prepare_store",
        encode_tokens(TOKENS),
        wait_s=10.0,
        tenant="alpha",
        session_id="s",
        block_ids=[1, 2],
        expected_resume_s=60.0,
    )
    assert answer is not None and answer["ok"], answer
    assert client.tenant == "gamma" and core.get("gamma", "s").state == State.PAUSING
    assert core.get("alpha", "s").state == State.PARKED
    client.close()
    alpha.close()
    beta.close()


def test_a_plan_is_finished_only_on_the_connection_that_made_it(
    control_daemon: ControlDaemon, worker: Worker
) -> None:
    daemon, path = control_daemon, control_daemon.service.socket_path
    owner, other, stranger = Raw(path), Raw(path), Raw(path)
    owner.hello()
    other.hello()  # the same tenant (default), another connection
    stranger.hello()
    plan = _prepare(owner, "s")
    worker.write(plan["slots"], seed=9)
    before = state(daemon)
    frame = {"op": "complete_store", "store_id": plan["store_id"], "ok": True}
    no_digest = other.send({**frame, "digests": None})
    assert no_digest["cause"] == "bad_request" and state(daemon) == before
    digest = worker.digests(plan["slots"])
    taken = other.send({**frame, "digests": digest})
    assert taken["ok"] is False and taken["cause"] == "not_found", taken
    failed = other.send({**frame, "ok": False})
    assert failed["cause"] == "not_found" and state(daemon) == before
    assert owner.send({**frame, "digests": digest})["decision"] == "parked"
    row = daemon.service.driver.core.get("default", "s")
    assert row.state == State.PARKED and (row.parked_handle or {})["digests"] == digest

    load = _begin_load(owner, "s")
    assert load["ok"], load
    before = state(daemon)
    done = {"op": "load_done", "load_id": load["load_id"]}
    dropped = stranger.send({**done, "ok": False, "cause": "checksum"})
    assert dropped["cause"] == "not_found" and state(daemon) == before  # the copy is kept
    assert owner.send({**done, "ok": True})["restored_tokens"] == 2 * BLOCK
    for conn in (owner, other, stranger):
        conn.close()


def test_the_connections_of_one_engine_share_their_plans(
    control_daemon: ControlDaemon, worker: Worker
) -> None:
    daemon, path = control_daemon, control_daemon.service.socket_path
    alpha = _token(daemon, "alpha")
    scheduler, engine_worker, elsewhere = Raw(path), Raw(path), Raw(path)
    scheduler.hello(alpha, peer="engine-1")
    engine_worker.hello(alpha, peer="engine-1")
    elsewhere.hello(_token(daemon, "beta"), peer="engine-1")  # another tenant: not shared
    plan = _prepare(scheduler, "s")
    worker.write(plan["slots"], seed=2)
    frame = {"op": "complete_store", "store_id": plan["store_id"], "ok": True}
    frame["digests"] = worker.digests(plan["slots"])
    assert elsewhere.send(frame)["cause"] == "not_found"
    # The scheduler's connection ends (a time-out): the worker still finishes the copy.
    server = daemon.service.server
    scheduler.close()
    wait_until(lambda: server.connections == 3)  # the fixture's client is the third
    assert daemon.service.driver.pending() == (1, 0)
    assert engine_worker.send(frame)["decision"] == "parked"
    engine_worker.close()
    elsewhere.close()


def test_a_closed_connection_fails_its_plans_at_once(
    control_daemon: ControlDaemon, worker: Worker
) -> None:
    daemon, path = control_daemon, control_daemon.service.socket_path
    conn = Raw(path)
    conn.hello()
    assert _complete(conn, worker, _prepare(conn, "parked"))["decision"] == "parked"
    _prepare(conn, "pausing", [t + 7 for t in TOKENS])
    assert _begin_load(conn, "parked")["ok"]
    driver = daemon.service.driver
    assert driver.pending() == (1, 1)
    conn.close()
    degraded = daemon.service.degraded  # counted once both are failed
    wait_until(lambda: degraded["connection_closed"] == 2, timeout=10)
    assert driver.pending() == (0, 0)
    core = driver.core
    assert core.get("default", "pausing").state == State.ACTIVE  # its park failed
    assert core.get("default", "parked").state == State.PARKED  # its load did not happen
    assert daemon.service.tier is not None and daemon.service.tier.used_blocks == 2
