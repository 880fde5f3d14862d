"""PreparedWrites store exactly what SQLAlchemy Core's ``conn.execute`` stores.

Two real SQLite files with the migrated schema: the same rows and changes go into one
through Core statements (what the store did before) and into the other through
:class:`PreparedWrites`; the raw rows, read back with ``sqlite3``, must be equal, the JSON
columns' ``'null'`` for None and their text included.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, Table, insert, update
from sqlalchemy.exc import IntegrityError

from agentpark.store.db import open_database
from agentpark.store.migrate import upgrade
from agentpark.store.models import EventRow, SessionRow
from agentpark.store.prepared import PreparedWrites
from agentpark.store.repository import SessionStore
from tests.harness import session_row

SESSIONS: Table = SessionRow.__table__  # type: ignore[assignment]
EVENTS: Table = EventRow.__table__  # type: ignore[assignment]

FIRST: dict[str, Any] = {
    "session_id": "s1",
    "tenant": "t",
    "state": "active",
    "tier": None,
    "num_tokens": 3,
    "kv_blocks": 1,
    "kv_bytes": 4096,
    "created_at": 1.5,
    "last_active_at": 2.25,
    "pause_count": 0,
    "metadata": {"agent": "ü", "n": [1, 2]},
    "token_log": b"\x00\x01\xff",
    "next_logits": None,
    "parked_handle": None,
}
CHANGES: list[dict[str, Any]] = [
    {"state": "parked", "tier": "dram", "parked_handle": {"slots": [3, 4]}, "paused_at": 9.0},
    {"state": "active", "tier": None, "parked_handle": None, "checksum": "ab" * 8},
    {"metadata": {}, "token_log": b"", "kv_blocks": 0},
]
EVENT: dict[str, Any] = {
    "tenant": "t",
    "session_id": "s1",
    "kind": "pause",
    "at": 3.0,
    "duration_ms": 0.25,
    "bytes": 4096,
    "detail": None,
}


def _database(path: Path) -> Engine:
    url = f"sqlite:///{path}"
    upgrade(url)
    return open_database(url)[0]


def _rows(path: Path, table: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()


def test_prepared_writes_store_the_bytes_core_statements_store(tmp_path: Path) -> None:
    core_db, prepared_db = tmp_path / "core.db", tmp_path / "prepared.db"
    core_engine, prepared_engine = _database(core_db), _database(prepared_db)
    prepared = PreparedWrites(prepared_engine.dialect)
    with core_engine.begin() as conn:
        seq = conn.execute(insert(SESSIONS).returning(SESSIONS.c.seq), FIRST).scalar_one()
        conn.execute(insert(EVENTS), {**EVENT, "session_seq": seq})
    with prepared_engine.begin() as conn:
        assert prepared.insert(conn, SESSIONS, "seq", FIRST) == seq
        event_id = prepared.insert(conn, EVENTS, "id", {**EVENT, "session_seq": seq})
        assert event_id == 1
    for change in CHANGES:
        with core_engine.begin() as conn:
            conn.execute(update(SESSIONS).where(SESSIONS.c.seq == seq).values(change))
        with prepared_engine.begin() as conn:
            prepared.update(conn, SESSIONS, "seq", seq, change)
        assert _rows(prepared_db, "sessions") == _rows(core_db, "sessions")
    assert _rows(prepared_db, "events") == _rows(core_db, "events")
    # The JSON columns hold JSON text, None as 'null', as Core writes them.
    with sqlite3.connect(prepared_db) as raw:
        stored = raw.execute("SELECT metadata, parked_handle FROM sessions").fetchone()
    assert stored == ("{}", "null")
    core_engine.dispose()
    prepared_engine.dispose()


def test_a_refused_prepared_write_is_sqlalchemys_error(tmp_path: Path) -> None:
    """The store's refusal handling (IntegrityError: an id taken) needs SQLAlchemy's
    wrapped errors, not sqlite3's."""
    engine = _database(tmp_path / "a.db")
    prepared = PreparedWrites(engine.dialect)
    with engine.begin() as conn:
        prepared.insert(conn, SESSIONS, "seq", FIRST)
    with pytest.raises(IntegrityError), engine.begin() as conn:
        prepared.insert(conn, SESSIONS, "seq", FIRST)
    assert len(_rows(tmp_path / "a.db", "sessions")) == 1
    engine.dispose()


def test_the_store_reads_back_what_its_prepared_writes_wrote(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    upgrade(url)
    store = SessionStore(*open_database(url))
    row = session_row(meta={"k": "v"})
    store.insert(row, EventRow(tenant=row.tenant, session_id=row.session_id, kind="create", at=1))
    row.state, row.tier, row.parked_handle = "parked", "dram", {"slots": [7]}
    pause = EventRow(tenant=row.tenant, session_id=row.session_id, kind="pause", at=2)
    store.save(row, pause)
    got = store.get(row.tenant, row.session_id)
    assert got is not None
    assert (got.state, got.tier, got.parked_handle, got.meta) == (
        "parked",
        "dram",
        {"slots": [7]},
        {"k": "v"},
    )
    assert pause.id is not None and pause.session_seq == row.seq
    store.close()
