"""The event log: every transition is an event, written in the same transaction as the row
it explains, then handed to the listeners (metrics, learned tool pauses, counters).

Listeners added after start-up first see the events start-up wrote (sessions lost to a
restart), so metrics count those too. A listener that raises is logged, never fatal.

An event of an operation that serves an engine's request (a live session's
``request_id``, set by agentpark.parking.external) names that request: :class:`EventLog`
stamps it on every event it writes for the session while the operation holds it, so the
transitions that build events need not know of requests.

A commit the database refuses puts the row back as it was last written and raises
StorageUnavailableError (503): the caller undoes the rest of its step (blocks, slots,
tokens), so memory and the database agree on what happened: nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from agentpark.enums import EventKind, Reason
from agentpark.errors import StorageUnavailableError
from agentpark.store.models import EventRow, SessionRow
from agentpark.store.repository import SessionStore

__all__ = ["EventListener", "EventLog"]

log = logging.getLogger(__name__)

EventListener = Callable[[EventRow], None]
RequestOf = Callable[[SessionRow], str | None]
"""The request a session's operation in progress serves, if any (the core's registry)."""

DETAIL_LIMIT = 1024  # events.detail is a String(1024)


class EventLog:
    def __init__(self, store: SessionStore, request_of: RequestOf | None = None) -> None:
        self.store = store
        self._request_of = request_of
        self._listeners: list[EventListener] = []
        self._startup: list[EventRow] | None = []

    def add_listener(self, listener: EventListener) -> None:
        """Call ``listener`` with every committed event, starting with those of start-up."""
        for event in self._startup or ():
            listener(event)
        self._listeners.append(listener)

    @staticmethod
    def event(
        row: SessionRow,
        kind: EventKind,
        at: float,
        *,
        from_state: str | None = None,
        to_state: str | None = None,
        from_tier: str | None = None,
        to_tier: str | None = None,
        reason: str = Reason.EXPLICIT,
        nbytes: int | None = None,
        duration_ms: float | None = None,
        detail: str | None = None,
    ) -> EventRow:
        """A new event about ``row`` (not yet written)."""
        return EventRow(
            tenant=row.tenant,
            session_id=row.session_id,
            kind=kind,
            at=at,
            from_state=from_state,
            to_state=to_state,
            from_tier=from_tier,
            to_tier=to_tier,
            reason=reason,
            bytes=nbytes,
            duration_ms=duration_ms,
            detail=None if detail is None else detail[:DETAIL_LIMIT],
        )

    def insert(self, row: SessionRow, event: EventRow) -> None:
        """Write a new session with its first event, then notify."""
        self._stamp(row, (event,))
        self.store.insert(row, event)
        self._notify(event)

    def commit(self, row: SessionRow, *events: EventRow) -> None:
        """Persist the row with the events that explain it, then notify.

        Refused by the database: the row is put back as last written, and it raises.
        """
        self.commit_many([(row, events, False)])

    def commit_many(self, items: Sequence[tuple[SessionRow, Sequence[EventRow], bool]]) -> None:
        """Several rows with their events in one transaction (SessionStore.write_many),
        then notify. Refused: every row is put back as last written, and it raises."""
        for row, events, _ in items:
            self._stamp(row, events)
        try:
            self.store.write_many(items)
        except StorageUnavailableError:
            for row, _, _ in items:
                self.store.revert(row)
            raise
        for _, events, _ in items:
            for event in events:
                self._notify(event)

    def commit_at_startup(self, row: SessionRow, *events: EventRow) -> None:
        """Like commit, before any listener exists: kept for listeners added later."""
        self.store.save(row, *events)
        if self._startup is not None:
            self._startup.extend(events)

    def _stamp(self, row: SessionRow, events: Sequence[EventRow]) -> None:
        """Name the request the session's operation serves on events that name none."""
        request_id = None if self._request_of is None else self._request_of(row)
        if request_id is None:
            return
        for event in events:
            if event.request_id is None:
                event.request_id = request_id

    def failure(
        self,
        row: SessionRow,
        kind: EventKind,
        exc: Exception,
        *,
        at: float,
        from_tier: str | None = None,
        to_tier: str | None = None,
    ) -> None:
        """Record a failed copy; the row stays as it was before the attempt."""
        log.error("%s for %s/%s: %s", kind, row.tenant, row.session_id, exc)
        event = self.event(
            row,
            kind,
            at,
            to_state=row.state,
            from_tier=from_tier,
            to_tier=to_tier,
            detail=f"{type(exc).__name__}: {exc}",
        )
        try:
            self.commit(row, event)
        except StorageUnavailableError:  # the failure itself is what the caller raises
            log.error(
                "could not record %s for %s/%s: storage unavailable",
                kind,
                row.tenant,
                row.session_id,
            )

    def _notify(self, event: EventRow) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                log.exception("event listener failed on %s", event.kind)
