"""Slow and down told apart, and a first turn that does not pay the daemon's start-up
(issue 21 item 3).

Reproducers: after every daemon start the first turn missed the 50 ms ``prepare_store``
budget (the daemon's first SQLite commit and its first compiled INSERTs) and was logged
"did not answer", as a dead daemon is; a slow first commit must lose no session.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Insert

from agentpark.connectors.client import ControlClient
from agentpark.connectors.scheduler import SchedulerSide
from agentpark.enums import State
from agentpark.store.db import open_database
from agentpark.store.repository import SessionStore
from tests.connectors.conftest import TENANT, ControlDaemon, control_service
from tests.connectors.test_vllm_sides import _turn
from tests.control.test_control import BLOCK, LAYOUT
from tests.harness.wait import wait_until


def _kept_why(answer: dict[str, Any] | None) -> str:
    assert answer is not None
    return str(answer["agentpark"]["why"])


def test_a_slow_first_commit_is_counted_slow_says_so_and_loses_no_session(
    control_daemon: ControlDaemon,
) -> None:
    daemon = control_daemon
    path = str(daemon.service.socket_path)
    worker = ControlClient(None, socket_path=path, timeout_s=10, peer="engine-a")
    # vLLM's scheduler: the 50 ms budget (connected first, so only the park can miss it).
    budget = ControlClient(None, socket_path=path, timeout_s=0.05, peer="engine-a")
    scheduler = SchedulerSide(budget, tenant=TENANT, block_size=BLOCK)
    db = sqlite3.connect(daemon.settings.database_url.removeprefix("sqlite:///"))
    db.isolation_level = None
    try:
        assert worker.call("register", wait_s=10, layout=LAYOUT.to_wire())
        assert budget.call("match", b"", session_id="warm", num_computed=0, wait_s=10)
        db.execute("BEGIN IMMEDIATE")  # the daemon's next commit waits on this one
        try:
            keep, answer = scheduler.request_finished(_turn("r1", "slow-commit", 2), [1, 2, 3])
        finally:
            db.execute("ROLLBACK")
        why = _kept_why(answer)
        assert not keep and answer is not None and answer["agentpark"]["decision"] == "kept"
        assert why.startswith("the daemon answered prepare_store too late (")
        assert why.endswith(" ms > 50 ms budget)"), why
        assert "did not answer" not in why
        assert budget.counts == {"slow": 1}, budget.counts  # not daemon_unreachable
        # The daemon finished the park after the connector left: undone, the session ACTIVE.
        wait_until(lambda: "pause_failed" in daemon.kinds("slow-commit"), timeout=10)
        # The worker, its connection renewed, registers again: still no session lost.
        worker.close()
        assert worker.call("register", wait_s=10, layout=LAYOUT.to_wire())
        row = daemon.service.driver.core.get(TENANT, "slow-commit")
        assert row.state == State.ACTIVE, (row.state, row.lost_reason)
        # The next answer carries the count to the daemon, as "slow".
        assert budget.call("match", b"", session_id="warm", num_computed=0, wait_s=10)
        assert daemon.service.degraded["slow"] >= 1
    finally:
        db.close()
        budget.close()
        worker.close()


def test_a_daemon_that_is_down_is_still_told_apart_from_a_slow_one(tmp_path: Path) -> None:
    client = ControlClient(None, socket_path=str(tmp_path / "no.sock"), timeout_s=0.05)
    scheduler = SchedulerSide(client, tenant=TENANT, block_size=BLOCK)
    _, answer = scheduler.request_finished(_turn("r1", "down", 2), [1, 2, 3])
    why = _kept_why(answer)
    assert why.startswith("cannot connect to ") and "too late" not in why
    assert client.counts == {"daemon_unreachable": 1}


def test_a_started_daemon_has_made_its_first_write_and_compiled_a_turns_inserts(
    control_daemon: ControlDaemon,
) -> None:
    daemon = control_daemon
    daemon.service.stop()
    daemon.service.driver.core.close()
    # A new process's store: nothing compiled, the database not written since it opened.
    store = SessionStore(*open_database(daemon.settings.database_url))
    compiled: list[object] = []
    prepared = store._prepared
    real_compile = prepared._compile

    def counting(stmt: Any) -> Any:
        compiled.append(stmt)
        return real_compile(stmt)

    prepared._compile = counting  # type: ignore[method-assign]  # a spy on the real one
    daemon.store.close()
    daemon.store = store
    daemon.service = control_service(daemon.settings, store)
    daemon.service.start()  # warms up: the WAL's first write, the INSERTs compiled
    assert len(compiled) == 2, compiled
    wal = Path(daemon.settings.database_url.removeprefix("sqlite:///") + "-wal")
    assert wal.stat().st_size > 0
    client = ControlClient(None, socket_path=str(daemon.service.socket_path), timeout_s=10)
    try:
        assert client.call("register", wait_s=10, layout=LAYOUT.to_wire())
        plan = client.call(
            "prepare_store",
            b"",
            session_id="first",
            block_ids=[],
            tool="search",
            expected_resume_s=60.0,
        )
        assert plan is not None and plan["ok"], plan
        # The first turn compiled no INSERT (at most the UPDATE of the columns it changed).
        assert not any(isinstance(stmt, Insert) for stmt in compiled[2:]), compiled
    finally:
        client.close()
