"""Opening the database again in a process that already has it open keeps SQLite's locks.

Reproducer: ``open_database`` made the file 0600 by opening and closing it, and closing any
descriptor of a file drops every POSIX lock the process holds on it, SQLite's included.
The daemon opens the database twice (the session store, then the token store), so a write
in flight lost its lock: another process could write at the same time, and the next write
here failed with "disk I/O error" (503 storage_unavailable in the test suite).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from agentpark.store.db import open_database

_OTHER_WRITER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)
try:
    conn.execute("BEGIN IMMEDIATE")
except sqlite3.OperationalError as exc:
    print("refused:", exc)
else:
    print("got the write lock")
"""


def _other_process_writes(path: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _OTHER_WRITER, str(path)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_second_open_keeps_the_write_lock_of_a_transaction_in_flight(tmp_path: Path) -> None:
    path = tmp_path / "agentpark.db"
    url = f"sqlite:///{path}"
    first, _ = open_database(url)
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        writer.execute("CREATE TABLE t (x INTEGER)")
        writer.execute("BEGIN IMMEDIATE")  # this process holds the write lock now
        writer.execute("INSERT INTO t VALUES (1)")
        assert _other_process_writes(path).startswith("refused")
        second, _ = open_database(url)  # what the daemon's token store does at start
        try:
            assert _other_process_writes(path).startswith("refused"), "the lock was dropped"
            writer.execute("COMMIT")
        finally:
            second.dispose()
    finally:
        writer.close()
        first.dispose()
