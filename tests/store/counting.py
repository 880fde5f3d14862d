"""A SQLite engine that counts what queries cost: rows fetched and VM steps.

``rows``: rows handed from SQLite to Python (every fetch of a cursor). ``steps``: SQLite's
virtual machine instructions (a progress handler called on every one), which grow with the
rows a query reads inside SQLite even when it returns few: a full scan shows up here.
Both are deterministic for given data, unlike a time.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine

__all__ = ["Counter", "counting_engine"]


class Counter:
    def __init__(self) -> None:
        self.rows = 0
        self.steps = 0

    def reset(self) -> None:
        self.rows = self.steps = 0


def counting_engine(path: Path) -> tuple[Engine, Counter]:
    counter = Counter()

    class CountingCursor(sqlite3.Cursor):
        def fetchone(self) -> Any:
            row = super().fetchone()
            counter.rows += row is not None
            return row

        def fetchmany(self, size: int | None = None) -> list[Any]:
            rows = super().fetchmany(self.arraysize if size is None else size)
            counter.rows += len(rows)
            return rows

        def fetchall(self) -> list[Any]:
            rows = super().fetchall()
            counter.rows += len(rows)
            return rows

        def __next__(self) -> Any:
            row = super().__next__()
            counter.rows += 1
            return row

    class CountingConnection(sqlite3.Connection):
        def cursor(self, factory: Any = CountingCursor) -> Any:
            return super().cursor(factory)

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(path, factory=CountingConnection, check_same_thread=False)
        conn.execute("PRAGMA foreign_keys=ON")

        def step() -> int:
            counter.steps += 1
            return 0

        conn.set_progress_handler(step, 1)
        return conn

    engine = create_engine("sqlite://", creator=connect)
    with engine.connect():  # the dialect's first-connect queries are not the test's
        pass
    counter.reset()
    return engine, counter
