"""Retention and bounded reads against a real SQLite file (migrated by alembic).

Growth is shown by counting, never by timing: rows SQLite hands to Python and SQLite's own
VM steps (tests/store/counting.py) at 20k and at 200k rows of the same shape.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from agentpark.config import RetentionSettings
from agentpark.history import transfer_figures
from agentpark.policy.tools import ToolStats
from agentpark.store.db import open_database
from agentpark.store.migrate import upgrade
from agentpark.store.models import EventRow
from agentpark.store.repository import SessionStore
from agentpark.store.retention import Retention, RetentionStore
from agentpark.store.samples import EventFigure, SampleStore
from tests.harness import session_row
from tests.store.counting import counting_engine

TOOLS = ("search", "calc", "browse", "shell", "sql")
T0 = 1_700_000_000.0
HOUR = 3600.0


def _database(tmp_path: Path) -> Path:
    path = tmp_path / "agentpark.db"
    upgrade(f"sqlite:///{path}")
    return path


def _fill(
    path: Path, rows: list[tuple[int, str, float, float | None, int | None, str | None]]
) -> None:
    """Insert events (session_seq, kind, at, duration_ms, bytes, detail) in one transaction,
    with a session row for each session_seq used."""
    with sqlite3.connect(path) as conn:
        for seq in sorted({r[0] for r in rows}):
            conn.execute(
                "INSERT OR IGNORE INTO sessions (seq, session_id, tenant, state, num_tokens, "
                "kv_blocks, kv_bytes, created_at, last_active_at, pause_count, metadata, "
                "token_log) VALUES (?, ?, 't', 'active', 0, 0, 0, ?, ?, 0, '{}', x'')",
                (seq, f"s{seq}", T0, T0),
            )
        conn.executemany(
            "INSERT INTO events (session_seq, tenant, session_id, kind, at, duration_ms, "
            "bytes, detail) VALUES (?, 't', 's', ?, ?, ?, ?, ?)",
            rows,
        )


def _tool_rows(
    n: int, start: int = 0
) -> list[tuple[int, str, float, float | None, int | None, str | None]]:
    return [
        (1, "tool_return", T0 + i, float(i % 997), None, TOOLS[i % len(TOOLS)])
        for i in range(start, start + n)
    ]


# ---- learned tool pauses at start-up ------------------------------------------------------


def test_tool_pauses_load_a_bounded_number_of_rows_whatever_the_table_holds(
    tmp_path: Path,
) -> None:
    """200k tool_return rows: start-up reads tools x window rows, and SQLite's own work
    does not grow with the table (the window query it replaces scanned every row)."""
    path = _database(tmp_path)
    engine, counter = counting_engine(path)
    store = SessionStore(engine, None)  # type: ignore[arg-type]
    window = 16
    _fill(path, _tool_rows(20_000))
    counter.reset()
    small = store.tool_returns(window)
    steps_small = counter.steps
    _fill(path, _tool_rows(180_000, start=20_000))
    counter.reset()
    large = store.tool_returns(window)
    assert len(small) == len(large) == len(TOOLS) * window
    assert counter.rows <= len(TOOLS) * (window + 1)  # the tools, then their newest rows
    # 180k more rows: a scan would cost well over 180k VM steps; seeks cost a few per level.
    assert counter.steps - steps_small < 5_000, (steps_small, counter.steps)
    # The newest of each tool, oldest first, as ToolStats.load expects.
    assert [e.id for e in large] == sorted(e.id for e in large)
    stats = ToolStats(window)
    stats.load(large)
    assert stats.summary() == dict.fromkeys(TOOLS, window)
    newest_search = [e.duration_ms for e in large if e.detail == "search"]
    expected = [float(i % 997) for i in range(200_000) if i % len(TOOLS) == 0][-window:]
    assert newest_search == expected
    engine.dispose()


# ---- /v1/host/latency's figures -----------------------------------------------------------


def _figure_rows(
    n: int, seed: int
) -> list[tuple[int, str, float, float | None, int | None, str | None]]:
    rng = random.Random(seed)
    kinds = ("pause", "resume", "recompute", "restore_failed", "generate", "create")
    out: list[tuple[int, str, float, float | None, int | None, str | None]] = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        ms = None if rng.random() < 0.05 else round(rng.expovariate(1 / 20), 3)
        nbytes = rng.randrange(1, 1 << 20) if kind in ("pause", "resume") else None
        out.append((1, kind, T0 + i * 0.01, ms, nbytes, None))
    return out


def test_window_figures_are_what_transfer_figures_makes_of_the_events(tmp_path: Path) -> None:
    path = _database(tmp_path)
    rows = _figure_rows(3_000, seed=1)
    _fill(path, rows)
    samples = SampleStore(*open_database(f"sqlite:///{path}"))
    since, until = T0 + 3.0, T0 + 21.5
    events = [
        EventFigure(i + 1, kind, at, ms, nbytes, None, None)
        for i, (_, kind, at, ms, nbytes, _) in enumerate(rows)
        if since <= at <= until
    ]
    expected = transfer_figures(events)
    expected.pop("last_event_id")
    got = samples.window_figures(since, until)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), key
    empty = samples.window_figures(T0 - 10, T0 - 5)
    assert empty["pauses"] == 0 and empty["pause_p50_ms"] is None
    assert empty["resume_p99_ms"] is None


def test_latency_window_fetches_a_handful_of_rows_at_200k_events(tmp_path: Path) -> None:
    path = _database(tmp_path)
    _fill(path, _figure_rows(200_000, seed=2))
    engine, counter = counting_engine(path)
    samples = SampleStore(engine, None)  # type: ignore[arg-type]
    figures = samples.window_figures(T0, T0 + 200_000 * 0.01)
    assert figures["pauses"] == 200_000 // 6 + 1  # i % 6 == 0 for i < 200k
    assert counter.rows <= 4 + 2 + 2  # four kinds' sums, two ranks per percentile pair
    engine.dispose()


# ---- pruning ------------------------------------------------------------------------------


def _retention(path: Path, **settings: float) -> tuple[Retention, SessionStore]:
    engine, sessions = open_database(f"sqlite:///{path}")
    cfg = RetentionSettings(**{"batch_rows": 7, **settings})
    return Retention(RetentionStore(engine), cfg), SessionStore(engine, sessions)


def _count(path: Path, where: str = "1") -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute(f"SELECT count(*) FROM events WHERE {where}").fetchone()[0])


def test_events_and_tool_returns_are_pruned_by_their_own_age_in_batches(tmp_path: Path) -> None:
    path = _database(tmp_path)
    # One event of each of three kinds per hour over 10 hours.
    rows = [
        (1, kind, T0 + h * HOUR, 1.0, None, "search" if kind == "tool_return" else None)
        for h in range(10)
        for kind in ("pause", "generate", "tool_return")
        for _ in range(5)
    ]
    _fill(path, rows)
    retention, store = _retention(path, events_h=3.0, tool_returns_h=6.0)
    now = T0 + 9 * HOUR + 1
    report = retention.run(now)
    # at < now - 3h: hours 0..6 (7 hours x 5) of pause and generate; tool returns 0..3
    assert report.events == 2 * 7 * 5
    assert report.tool_returns == 4 * 5
    assert _count(path, "kind != 'tool_return'") == 2 * 3 * 5
    assert _count(path, "kind = 'tool_return'") == 6 * 5
    assert retention.run(now).total == 0
    store.close()


def test_a_stop_asked_between_batches_leaves_the_rest_for_the_next_run(tmp_path: Path) -> None:
    path = _database(tmp_path)
    _fill(path, [(1, "pause", T0, 1.0, None, None)] * 30)
    retention, store = _retention(path, events_h=1.0)
    batches = iter(range(100))
    retention.should_stop = lambda: next(batches) >= 2
    assert retention.run(T0 + 2 * HOUR).events == 14  # two batches of 7
    retention.should_stop = lambda: False
    assert retention.run(T0 + 2 * HOUR).events == 16
    store.close()


def test_deleted_sessions_are_purged_keeping_their_tool_returns(tmp_path: Path) -> None:
    path = _database(tmp_path)
    retention, store = _retention(path, deleted_h=2.0, events_h=1000.0, tool_returns_h=1000.0)
    old = session_row(session_id="old", state="deleted", deleted_at=T0, token_log=b"x" * 64)
    recent = session_row(session_id="recent", state="deleted", deleted_at=T0 + 3 * HOUR)
    live = session_row(session_id="live")
    for row in (old, recent, live):
        store.insert(row, EventRow(tenant="t", session_id=row.session_id, kind="create", at=T0))
        for i in range(10):
            store.save(row, EventRow(tenant="t", session_id=row.session_id, kind="pause", at=T0))
            store.save(
                row,
                EventRow(
                    tenant="t",
                    session_id=row.session_id,
                    kind="tool_return",
                    at=T0 + i,
                    detail="search",
                    duration_ms=5.0,
                ),
            )
    report = retention.run(T0 + 4 * HOUR)
    # old: 11 events deleted, 10 tool returns unlinked, its row deleted
    assert report.purged_rows == 11 + 10 + 1
    assert store.get("t", "old") is None
    assert store.get("t", "recent") is not None and store.get("t", "live") is not None
    assert _count(path, "session_id = 'old'") == 10
    assert _count(path, "session_id = 'old' AND kind = 'tool_return' AND session_seq IS NULL") == 10
    assert len(store.tool_returns(100)) == 30  # every tool return still teaches the pause
    # The id is free again.
    again = session_row(session_id="old")
    store.insert(again, EventRow(tenant="t", session_id="old", kind="create", at=T0 + 4 * HOUR))
    assert store.get("t", "old") is not None
    assert retention.run(T0 + 4 * HOUR).total == 0
    store.close()


def test_host_samples_are_pruned_in_batches(tmp_path: Path) -> None:
    from agentpark.store.models import HostSampleRow

    path = _database(tmp_path)
    samples = SampleStore(*open_database(f"sqlite:///{path}"))
    for i in range(23):
        samples.insert(
            HostSampleRow(
                at=T0 + i, step_s=1.0, pool_total_bytes=0, pool_used_bytes=0, reclaimed_bytes=0
            )
        )
    assert samples.prune(T0 + 20, batch_rows=4) == 20
    assert samples.count() == 3


def test_migration_0007_keeps_the_events_and_downgrades(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentpark.db'}"
    upgrade(url, "0005")
    path = tmp_path / "agentpark.db"
    _fill(path, _tool_rows(50))
    upgrade(url)
    assert _count(path) == 50
    with sqlite3.connect(path) as conn:
        indexes = {r[1] for r in conn.execute("PRAGMA index_list(events)")}
        fks = conn.execute("PRAGMA foreign_key_list(events)").fetchall()
    assert {"ix_events_kind_at", "ix_events_kind_detail_id", "ix_events_session_seq"} <= indexes
    assert [fk[6] for fk in fks] == ["SET NULL"]  # on_delete
    from alembic import command

    from agentpark.store.migrate import alembic_config

    command.downgrade(alembic_config(url), "0005")
    assert _count(path) == 50
    with sqlite3.connect(path) as conn:
        assert [fk[6] for fk in conn.execute("PRAGMA foreign_key_list(events)")] == ["CASCADE"]
