"""Reads and writes of session rows and events; the only module that issues queries.

Rows handed out are detached (``expire_on_commit=False``): parking mutates its own row under
the session's lock and hands it back to :meth:`SessionStore.save` with the event that
explains the change, in one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from agentpark.enums import EventKind, State
from agentpark.store.models import EventRow, SessionRow

__all__ = ["SessionStore"]


class SessionStore:
    def __init__(self, engine: Engine, factory: sessionmaker[Session]) -> None:
        self._engine = engine
        self._factory = factory

    def close(self) -> None:
        self._engine.dispose()

    def insert(self, row: SessionRow, event: EventRow) -> None:
        """Insert a new session and its first event; ``row.seq`` is set on return."""
        with self._factory.begin() as db:
            db.add(row)
            db.flush()
            event.session_seq = row.seq
            db.add(event)

    def save(self, row: SessionRow, *events: EventRow) -> None:
        """Write the row's changed columns and the events that explain them, atomically."""
        with self._factory.begin() as db:
            db.add(row)
            for event in events:
                event.session_seq = row.seq
                db.add(event)

    def get(self, tenant: str, session_id: str) -> SessionRow | None:
        with self._factory() as db:
            stmt = select(SessionRow).where(
                SessionRow.tenant == tenant, SessionRow.session_id == session_id
            )
            return db.scalars(stmt).one_or_none()

    def live_rows(self) -> Sequence[SessionRow]:
        """Every session not deleted, oldest first: what the daemon re-attaches at start."""
        with self._factory() as db:
            stmt = (
                select(SessionRow).where(SessionRow.state != State.DELETED).order_by(SessionRow.seq)
            )
            return db.scalars(stmt).all()

    def page(
        self, tenant: str, state: str | None, limit: int, after_seq: int
    ) -> Sequence[SessionRow]:
        """Up to ``limit`` sessions with seq > after_seq; deleted ones only when asked for."""
        with self._factory() as db:
            stmt = select(SessionRow).where(SessionRow.tenant == tenant, SessionRow.seq > after_seq)
            if state is None:
                stmt = stmt.where(SessionRow.state != State.DELETED)
            else:
                stmt = stmt.where(SessionRow.state == state)
            return db.scalars(stmt.order_by(SessionRow.seq).limit(limit)).all()

    def events(self, tenant: str, session_id: str | None, limit: int) -> Sequence[EventRow]:
        """The newest ``limit`` events of a tenant (or of one of its sessions), newest first."""
        with self._factory() as db:
            stmt = select(EventRow).where(EventRow.tenant == tenant)
            if session_id is not None:
                stmt = stmt.where(EventRow.session_id == session_id)
            return db.scalars(stmt.order_by(EventRow.id.desc()).limit(limit)).all()

    def tool_returns(self, per_tool: int) -> list[EventRow]:
        """The newest ``per_tool`` tool_return events of each tool, oldest first.

        One query with a window function: at most ``per_tool`` rows per tool come back,
        however many the table holds.
        """
        rank = (
            func.row_number()
            .over(partition_by=EventRow.detail, order_by=EventRow.id.desc())
            .label("rank")
        )
        ranked = select(EventRow.id, rank).where(EventRow.kind == EventKind.TOOL_RETURN).subquery()
        stmt = (
            select(EventRow)
            .join(ranked, EventRow.id == ranked.c.id)
            .where(ranked.c.rank <= per_tool)
            .order_by(EventRow.id)
        )
        with self._factory() as db:
            return list(db.scalars(stmt).all())
