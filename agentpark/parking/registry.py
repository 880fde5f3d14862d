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
from sqlalchemy import event

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


class StateTally:
    """Live sessions by state and the KV bytes of the parked ones, kept as they change.

    ``GET /v1/host`` reads these in O(1) instead of walking every session: SQLAlchemy's
    attribute events on ``SessionRow.state`` and ``SessionRow.kv_bytes`` report each
    assignment to a row that a registry holds (the row carries its tally).
    """

    def __init__(self) -> None:
        self.by_state: dict[str, int] = {s.value: 0 for s in State}
        self.parked_bytes = 0
        self._lock = threading.Lock()

    def counted(self, row: SessionRow, sign: int) -> None:
        with self._lock:
            self.by_state[row.state] = self.by_state.get(row.state, 0) + sign
            if row.state == State.PARKED:
                self.parked_bytes += sign * row.kv_bytes

    def state_set(self, row: SessionRow, new: str, old: str) -> None:
        with self._lock:
            self.by_state[old] = self.by_state.get(old, 0) - 1
            self.by_state[new] = self.by_state.get(new, 0) + 1
            if old == State.PARKED:
                self.parked_bytes -= row.kv_bytes
            if new == State.PARKED:
                self.parked_bytes += row.kv_bytes

    def bytes_set(self, row: SessionRow, new: int, old: int) -> None:
        if row.state == State.PARKED:
            with self._lock:
                self.parked_bytes += new - old

    def figures(self) -> tuple[dict[str, int], int]:
        with self._lock:
            return dict(self.by_state), self.parked_bytes


_TALLY = "_agentpark_tally"  # the StateTally of the registry holding a row


@event.listens_for(SessionRow.state, "set", active_history=True)
def _on_state(row: SessionRow, new: str, old: object, _initiator: object) -> None:
    tally: StateTally | None = getattr(row, _TALLY, None)
    if tally is not None and isinstance(old, str) and new != old:
        tally.state_set(row, new, old)


@event.listens_for(SessionRow.kv_bytes, "set", active_history=True)
def _on_kv_bytes(row: SessionRow, new: int, old: object, _initiator: object) -> None:
    tally: StateTally | None = getattr(row, _TALLY, None)
    if tally is not None and isinstance(old, int) and new != old:
        tally.bytes_set(row, new, old)


class Registry:
    """Live (not deleted) sessions by key, and their tally by state; thread-safe."""

    def __init__(self) -> None:
        self._sessions: dict[SessionKey, LiveSession] = {}
        self._lock = threading.RLock()
        self.tally = StateTally()

    def __len__(self) -> int:
        return len(self._sessions)

    def find(self, key: SessionKey) -> LiveSession | None:
        return self._sessions.get(key)

    def add(self, live: LiveSession) -> None:
        with self._lock:
            self.remove(live)
            self._sessions[live.key] = live
            setattr(live.row, _TALLY, self.tally)
            self.tally.counted(live.row, +1)

    def remove(self, live: LiveSession) -> None:
        with self._lock:
            held = self._sessions.pop(live.key, None)
            if held is not None:
                self.tally.counted(held.row, -1)
                setattr(held.row, _TALLY, None)

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
