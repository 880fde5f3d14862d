"""The SQLite database: one file, WAL mode, opened the same way by daemon and tools.

:class:`StorageHealth` is whether the last write went through: a failed write (disk full,
I/O error, locked past the busy timeout) makes the daemon not ready, logged once; the
next write that succeeds, or :class:`StorageProbe`'s small write every
``reliability.storage_probe_s`` meanwhile, makes it ready again, logged once.

A WAL checkpoint (copying the log back into the database file, with an fsync) takes a few
milliseconds. SQLite runs one inside whichever commit crosses ``wal_autocheckpoint`` pages,
which put it on the path of a pause or resume about once every few hundred transitions.
The daemon runs :class:`WalCheckpointer` instead: a thread that checkpoints every second,
so the automatic one (kept as a backstop, at a higher mark) is not reached.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

__all__ = ["StorageHealth", "StorageProbe", "WalCheckpointer", "open_database"]

log = logging.getLogger(__name__)

AUTOCHECKPOINT_PAGES = 10_000  # ~40 MiB of log: only if the checkpointer falls behind


def open_database(url: str) -> tuple[Engine, sessionmaker[Session]]:
    """Create the engine (parent folder and a 0600 file too) with WAL, foreign keys and a
    busy timeout."""
    parsed = make_url(url)
    if parsed.drivername.startswith("sqlite") and parsed.database not in (None, "", ":memory:"):
        _private_sqlite_files(Path(parsed.database))
    engine = create_engine(url, connect_args={"check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=5000")
        cur.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
        cur.close()

    return engine, sessionmaker(engine, expire_on_commit=False)


def _private_sqlite_files(path: Path) -> None:
    """The database file and its -wal/-shm: 0600 whatever the umask.

    SQLite creates a new database file 0644 (it fchmods past the umask) but gives the
    -wal and -shm files it makes later the database file's own mode; so the file is made
    here first, 0600, and files an older version left looser are tightened.
    """
    from agentpark.statedir import private_file

    path.parent.mkdir(parents=True, exist_ok=True)
    private_file(path)
    for suffix in ("-wal", "-shm", "-journal"):
        private_file(path.with_name(path.name + suffix), create=False)


class WalCheckpointer:
    """Checkpoints the WAL every ``interval_s`` from its own thread (PASSIVE: it never
    blocks a writer or a reader)."""

    def __init__(self, engine: Engine, interval_s: float = 1.0) -> None:
        self.engine = engine
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def checkpoint(self) -> None:
        with self.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    def start(self) -> None:
        if self.engine.dialect.name != "sqlite" or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="agentpark-wal", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self.interval_s):
            try:
                self.checkpoint()
            except Exception:  # a busy or full disk: SQLite's own checkpoint still runs
                if not failing:  # once per outage, not every second
                    log.exception("WAL checkpoint failed (logged once until one works)")
                failing = True
            else:
                failing = False


class StorageHealth:
    """Whether database writes go through; transitions are logged once each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.error: str | None = None  # why the last write failed; None: writes work
        self.since: float | None = None  # when writes started failing
        self.failures = 0  # failed writes since then

    @property
    def ok(self) -> bool:
        return self.error is None

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            first = self.error is None
            self.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            self.failures += 1
            if first:
                self.since = time.time()
        if first:
            log.error("storage unavailable (writes fail; not ready until one works): %s", exc)

    def succeeded(self) -> None:
        if self.error is None:
            return
        with self._lock:
            was, failures = self.error, self.failures
            self.error, self.since, self.failures = None, None, 0
        if was is not None:
            log.warning("storage available again after %d failed writes (%s)", failures, was)


class StorageProbe:
    """While writes fail, try one every ``interval_s`` (nothing else may write meanwhile:
    /readyz says not ready, so a load balancer sends no traffic to recover with)."""

    def __init__(
        self, health: StorageHealth, probe: Callable[[], None], interval_s: float = 1.0
    ) -> None:
        self.health = health
        self.probe = probe
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="agentpark-probe", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self.health.ok:
                continue
            try:
                self.probe()  # records success or failure in the health itself
            except Exception:
                log.debug("storage probe failed", exc_info=True)
