"""The live sessions of this process and the one-operation-at-a-time lock of each.

A session's row lives in SQLite; its in-process half (token log, blocks, tier slots) lives
here. An operation takes the session's lock without waiting: a second operation on the
same session is refused with 409 ``session_busy`` naming the one in flight, so a caller
never waits behind a slow copy it did not ask for.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from agentpark.enums import State
from agentpark.errors import InvalidStateError, SessionBusyError, SessionNotFoundError
from agentpark.store.models import SessionRow

__all__ = ["LiveSession", "Registry", "SessionKey"]

SessionKey = tuple[str, str]
"""(tenant, session_id): the same id may exist in two tenants."""


@dataclass
class LiveSession:
    """A session's in-process half: what only this process can know (blocks, slots)."""

    row: SessionRow
    tokens: list[int]
    next_logits: np.ndarray | None
    block_table: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    operation: str | None = None

    @property
    def key(self) -> SessionKey:
        return (self.row.tenant, self.row.session_id)

    @property
    def busy(self) -> bool:
        return self.lock.locked()


class Registry:
    """Live (not deleted) sessions by key; thread-safe."""

    def __init__(self) -> None:
        self._sessions: dict[SessionKey, LiveSession] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._sessions)

    def find(self, key: SessionKey) -> LiveSession | None:
        return self._sessions.get(key)

    def add(self, live: LiveSession) -> None:
        with self._lock:
            self._sessions[live.key] = live

    def remove(self, live: LiveSession) -> None:
        with self._lock:
            self._sessions.pop(live.key, None)

    @contextmanager
    def adding(self) -> Iterator[dict[SessionKey, LiveSession]]:
        """Hold the registry while a create checks the key is free and adds it."""
        with self._lock:
            yield self._sessions

    def all(self) -> list[LiveSession]:
        with self._lock:
            return list(self._sessions.values())

    # ---- one operation at a time --------------------------------------------------------

    @staticmethod
    def acquire(live: LiveSession, name: str) -> None:
        """Take the session for one operation, or refuse: operations never queue."""
        if not live.lock.acquire(blocking=False):
            raise SessionBusyError(live.row.session_id, name, live.operation or "operation")
        live.operation = name
        if live.row.state == State.DELETED:
            Registry.release(live)
            raise InvalidStateError(
                f"session {live.row.session_id!r} is deleted", state=State.DELETED
            )

    @staticmethod
    def acquire_waiting(live: LiveSession, name: str, timeout: float) -> bool:
        """Take the session, waiting up to ``timeout`` seconds (drain); False if not."""
        if not live.lock.acquire(timeout=max(timeout, 0.0)):
            return False
        live.operation = name
        return True

    @staticmethod
    def release(live: LiveSession) -> None:
        live.operation = None
        live.lock.release()

    @contextmanager
    def operation(self, live: LiveSession, name: str) -> Iterator[LiveSession]:
        self.acquire(live, name)
        try:
            yield live
        finally:
            self.release(live)

    def require(self, key: SessionKey, row: SessionRow | None) -> LiveSession:
        """The live session, or the error a caller gets for a deleted or unknown one.

        ``row`` is the stored row for the key (None when there is none), looked up by the
        caller only when the session is not live.
        """
        live = self._sessions.get(key)
        if live is not None:
            return live
        if row is None:
            raise SessionNotFoundError(key[1])
        raise InvalidStateError(f"session {key[1]!r} is {row.state}", state=row.state)
