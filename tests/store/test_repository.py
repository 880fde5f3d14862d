"""SessionStore queries against a real SQLite file."""

from __future__ import annotations

from pathlib import Path

from agentpark.store.db import open_database
from agentpark.store.migrate import upgrade
from agentpark.store.models import EventRow
from agentpark.store.repository import SessionStore
from tests.harness import session_row


def _event(kind: str, detail: str | None, ms: float) -> EventRow:
    return EventRow(
        tenant="t",
        session_id="s",
        kind=kind,
        at=ms,
        reason="explicit",
        detail=detail,
        duration_ms=ms,
    )


def test_tool_returns_keeps_the_newest_per_tool_oldest_first(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    upgrade(url)
    store = SessionStore(*open_database(url))
    row = session_row(created_at=0.0, last_active_at=0.0)
    store.insert(row, _event("create", None, 0))
    for i in range(5):
        store.save(row, _event("tool_return", "search", 10.0 + i))
        store.save(row, _event("pause", "search", 99.0))  # not a tool return
    for i in range(2):
        store.save(row, _event("tool_return", "calc", 20.0 + i))
    kept = store.tool_returns(per_tool=3)
    assert [(e.detail, e.duration_ms) for e in kept] == [
        ("search", 12.0),
        ("search", 13.0),
        ("search", 14.0),
        ("calc", 20.0),
        ("calc", 21.0),
    ]
    assert store.tool_returns(per_tool=1)[-1].duration_ms == 21.0
    store.close()
