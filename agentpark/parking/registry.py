"""The live sessions of this process and the one-operation-at-a-time lock of each.

A session's row lives in SQLite; its in-process half (token log, blocks, tier slots) lives
here. One operation at a time holds a session, and who holds it decides what a second
caller gets:

- a user operation (an API call) behind another user operation: 409 ``session_busy``
  naming the one in flight; two callers racing on one session is the caller's conflict.
- a user operation behind the daemon's own work (a background operation: idle or
  pressure park, prefetch, demotion, a generate making room): it waits for that to
  finish, up to ``yield_s``; the daemon never makes a user request fail.
- a user operation behind a ``wait=false`` copy that has already shown its final state
  (it is only committing and letting go): it waits too, so a client that saw the new
  state never gets 409 for acting on it.
- a background operation never waits and never takes a session a user operation waits
  for: it is skipped (the policy retries on its next tick).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from agentpark.enums import State
from agentpark.errors import InvalidStateError, SessionBusyError, SessionNotFoundError
from agentpark.kvkeys import Lora
from agentpark.store.models import SessionRow
from agentpark.tiers.slots import Reservation

__all__ = ["LiveSession", "Registry", "SessionKey"]

SessionKey = tuple[str, str]
"""(tenant, session_id): the same id may exist in two tenants."""


_IN_FLIGHT = frozenset({State.PAUSING, State.RESUMING, State.RECOMPUTING})


class SessionLock:
    """Who holds a session (if anyone), and how many user operations wait for it."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.holder: str | None = None
        self.background = False  # the holder is the daemon's own work
        self.detached = False  # the holder is a wait=false copy the caller has left
        self.waiting = 0  # user operations waiting for the holder to finish

    def locked(self) -> bool:
        return self.holder is not None


@dataclass
class LiveSession:
    """A session's in-process half: what only this process can know (blocks, slots)."""

    row: SessionRow
    tokens: list[int]
    next_logits: np.ndarray | None
    block_table: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    lock: SessionLock = field(default_factory=SessionLock)
    operation: str | None = None
    # The parked copy by content (agentpark.tiers.slots): each slot's block key (None: a
    # partial or pre-key block) and digest; ``digests`` None for a copy parked before keys
    # (``row.checksum`` covers it whole).
    keys: list[Hashable | None] = field(default_factory=list)
    digests: list[str | None] | None = None
    # What vLLM keys a block with besides its tokens (the request's cache_salt and LoRA).
    cache_salt: str | None = None
    lora: Lora | None = None
    # A park in flight: the slots reserved, which are new (to copy) and which shared.
    pending: Reservation | None = None

    @property
    def expected(self) -> str | list[str | None] | None:
        """What the parked copy must hash to: a digest per block, or one for the copy."""
        return self.digests if self.digests is not None else self.row.checksum

    # The engine's request the operation in progress serves (vLLM's request_id): the
    # events it commits name it (agentpark.parking.events). Cleared when it lets go.
    request_id: str | None = None

    @property
    def key(self) -> SessionKey:
        return (self.row.tenant, self.row.session_id)

    @property
    def busy(self) -> bool:
        return self.lock.locked()


def holds_kv(state: str, kv_blocks: int) -> bool:
    """Blocks in the pool or a parked copy: a session the policy loop has a rule for."""
    return kv_blocks > 0 or state == State.PARKED


class StateTally:
    """Live sessions by state, the KV bytes of the parked ones and which sessions hold KV.

    ``GET /v1/host`` reads these in O(1) instead of walking every session, and the policy
    loop walks only the sessions that hold KV (:meth:`holders`). The code that changes a
    row's state or KV (agentpark.parking.transitions) calls :meth:`update` after each
    change; the tally remembers what it counted for each session, so an update is the
    difference, whatever changed and however often. Walking all 10,000 rows of
    ``agentpark bench control`` took 8 ms of the GIL every tick, which is what requests
    arriving then waited for.
    """

    def __init__(self) -> None:
        self.by_state: dict[str, int] = {s.value: 0 for s in State}
        self.parked_bytes = 0
        self.holding: set[SessionKey] = set()
        self._counted: dict[SessionKey, tuple[str, int]] = {}  # (state, parked bytes)
        self._lock = threading.Lock()

    def update(self, row: SessionRow) -> None:
        """Count ``row`` as it is now (first time: added)."""
        key = (row.tenant, row.session_id)
        state = str(row.state)
        now = (state, row.kv_bytes if state == State.PARKED else 0)
        with self._lock:
            old = self._counted.get(key)
            if old != now:
                if old is not None:
                    self.by_state[old[0]] = self.by_state.get(old[0], 0) - 1
                    self.parked_bytes -= old[1]
                self.by_state[state] = self.by_state.get(state, 0) + 1
                self.parked_bytes += now[1]
                self._counted[key] = now
            if holds_kv(state, row.kv_blocks):
                self.holding.add(key)
            else:
                self.holding.discard(key)

    def remove(self, key: SessionKey) -> None:
        with self._lock:
            old = self._counted.pop(key, None)
            if old is not None:
                self.by_state[old[0]] = self.by_state.get(old[0], 0) - 1
                self.parked_bytes -= old[1]
            self.holding.discard(key)

    def holders(self) -> list[SessionKey]:
        with self._lock:
            return list(self.holding)

    def figures(self) -> tuple[dict[str, int], int]:
        with self._lock:
            return dict(self.by_state), self.parked_bytes


class Registry:
    """Live (not deleted) sessions by key, and their tally by state; thread-safe."""

    def __init__(self, yield_s: float = 30.0) -> None:
        self._sessions: dict[SessionKey, LiveSession] = {}
        self._lock = threading.RLock()
        self.tally = StateTally()
        self.yield_s = yield_s  # the longest a user operation waits for background work
        # Called (no lock held) whenever a session is let go: it may be idle now, which
        # is what a request waiting for pool blocks needs to know (it may park it).
        self.on_release: list[Callable[[], None]] = []

    def __len__(self) -> int:
        return len(self._sessions)

    def find(self, key: SessionKey) -> LiveSession | None:
        return self._sessions.get(key)

    def add(self, live: LiveSession) -> None:
        with self._lock:
            self.remove(live)
            self._sessions[live.key] = live
            self.tally.update(live.row)

    def remove(self, live: LiveSession) -> None:
        with self._lock:
            if self._sessions.pop(live.key, None) is not None:
                self.tally.remove(live.key)

    @contextmanager
    def adding(self) -> Iterator[dict[SessionKey, LiveSession]]:
        """Hold the registry while a create checks the key is free and adds it."""
        with self._lock:
            yield self._sessions

    def all(self) -> list[LiveSession]:
        with self._lock:
            return list(self._sessions.values())

    # ---- one operation at a time --------------------------------------------------------

    def acquire(self, live: LiveSession, name: str, *, background: bool = False) -> None:
        """Take the session for one operation, or refuse (see the module's docstring).

        ``background``: the daemon's own work; it is refused (409, which the policy loop
        logs and retries) whenever the session is held or a user operation waits for it.
        """
        lk = live.lock
        with lk.cond:
            if lk.holder is not None or (background and lk.waiting):
                if background or not self._yields(live):
                    raise SessionBusyError(
                        live.row.session_id, name, lk.holder or "waiting user operation"
                    )
                lk.waiting += 1
                try:
                    free = lk.cond.wait_for(
                        lambda: lk.holder is None or not self._yields(live), self.yield_s
                    )
                finally:
                    lk.waiting -= 1
                if not free or lk.holder is not None:
                    raise SessionBusyError(
                        live.row.session_id, name, lk.holder or "operation", waited_s=self.yield_s
                    )
            lk.holder, lk.background, lk.detached = name, background, False
            live.operation = name
        self._refuse_if_deleted(live)

    def try_acquire(self, live: LiveSession, name: str) -> bool:
        """Take the session for a user operation only if nobody holds it or waits for it:
        False at once otherwise (the event loop's fast path, which must never wait)."""
        lk = live.lock
        with lk.cond:
            if lk.holder is not None or lk.waiting:
                return False
            lk.holder, lk.background, lk.detached = name, False, False
            live.operation = name
        self._refuse_if_deleted(live)
        return True

    def _refuse_if_deleted(self, live: LiveSession) -> None:
        """Just taken: a session deleted meanwhile is let go again, and refused."""
        if live.row.state == State.DELETED:
            self.release(live)
            raise InvalidStateError(
                f"session {live.row.session_id!r} is deleted", state=State.DELETED
            )

    @staticmethod
    def _yields(live: LiveSession) -> bool:
        """Whether the holder gives way to a user operation (it is waited for, not 409)."""
        lk = live.lock
        return lk.background or (lk.detached and live.row.state not in _IN_FLIGHT)

    @staticmethod
    def detach(live: LiveSession) -> None:
        """The holder goes on in the background after its caller got an answer (wait=false)."""
        with live.lock.cond:
            live.lock.detached = True

    @staticmethod
    def acquire_waiting(live: LiveSession, name: str, timeout: float) -> bool:
        """Take the session, waiting up to ``timeout`` seconds (drain); False if not."""
        lk = live.lock
        with lk.cond:
            if not lk.cond.wait_for(lambda: lk.holder is None, max(timeout, 0.0)):
                return False
            lk.holder, lk.background, lk.detached = name, False, False
            live.operation = name
        return True

    def release(self, live: LiveSession) -> None:
        lk = live.lock
        with lk.cond:
            live.operation, live.request_id = None, None
            lk.holder, lk.background, lk.detached = None, False, False
            lk.cond.notify_all()
        for hook in self.on_release:
            hook()

    @contextmanager
    def operation(
        self, live: LiveSession, name: str, *, background: bool = False
    ) -> Iterator[LiveSession]:
        self.acquire(live, name, background=background)
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
