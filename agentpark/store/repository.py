"""Reads and writes of session rows and events; the only module that issues queries.

Rows handed out are detached (``expire_on_commit=False``): the session core mutates its
own row under the session's lock and hands it back to :meth:`SessionStore.save` with the
events that explain the change, in one transaction.

Writes are not ORM flushes: a transition is one ``UPDATE`` of the columns that changed
since the row was last written (the store remembers what it wrote on the row itself) plus
one ``INSERT`` per event, in one transaction, each compiled once for the dialect
(:mod:`agentpark.store.prepared`), so the bookkeeping of a pause costs about a tenth of a
millisecond whatever the number of sessions. JSON columns (``metadata``,
``parked_handle``) are compared by value: callers assign new values, never mutate in place.

A write the database refuses (disk full, I/O error, locked) raises
:class:`~agentpark.errors.StorageUnavailableError` (503) and is recorded in
:attr:`SessionStore.health`; :meth:`SessionStore.revert` puts a row back as it was last
written, so the caller's memory agrees with the database again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Table,
    and_,
    bindparam,
    delete,
    func,
    insert,
    inspect,
    or_,
    select,
)
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, defer, sessionmaker

from agentpark.enums import EventKind, State
from agentpark.errors import StorageUnavailableError
from agentpark.store.db import StorageHealth
from agentpark.store.models import EventRow, HostSampleRow, SessionRow
from agentpark.store.prepared import PreparedWrites
from agentpark.store.retention import distinct_event_values

__all__ = ["SessionStore"]

_SESSIONS: Table = SessionRow.__table__  # type: ignore[assignment]
_EVENTS: Table = EventRow.__table__  # type: ignore[assignment]
# (attribute, column name) of every mapped column but the key: ``meta`` is "metadata".
_SESSION_FIELDS = [
    (attr.key, attr.columns[0].name)
    for attr in inspect(SessionRow).column_attrs
    if attr.key != "seq"
]
_EVENT_FIELDS = [
    (attr.key, attr.columns[0].name) for attr in inspect(EventRow).column_attrs if attr.key != "id"
]
_WRITTEN = "_agentpark_written"  # what the store last wrote of a row (a plain attribute)
_SAMPLES: Table = HostSampleRow.__table__  # type: ignore[assignment]
_PROBE_BYTES = 16_384  # a probe write as large as a big transition (a token log)


class SessionStore:
    def __init__(
        self, engine: Engine, factory: sessionmaker[Session], health: StorageHealth | None = None
    ) -> None:
        self._engine = engine
        self._factory = factory
        self._prepared = PreparedWrites(engine.dialect)
        self.health = health or StorageHealth()

    @property
    def url(self) -> str:
        """The database, password hidden (for messages)."""
        return self._engine.url.render_as_string(hide_password=True)

    def close(self) -> None:
        self._engine.dispose()

    @contextmanager
    def _writing(self) -> Iterator[Connection]:
        """One write transaction; a refusal becomes StorageUnavailableError (503)."""
        try:
            with self._engine.begin() as conn:
                yield conn
        except IntegrityError:
            raise  # the caller's conflict (an id taken), not the storage's
        except DBAPIError as exc:
            self.health.failed(exc.orig if exc.orig is not None else exc)
            raise StorageUnavailableError(
                f"the database refused a write, nothing was changed: {exc.orig}",
                retry_after_s=5,
            ) from exc
        self.health.succeeded()

    def probe(self) -> None:
        """A write as large as a big transition, rolled back within its transaction:
        what tells a full or failing disk from one that works again."""
        with self._writing() as conn:
            probe = {"probe": "x" * _PROBE_BYTES}
            row = {
                "at": 0.0,
                "step_s": 0.0,
                "pool_total_bytes": 0,
                "pool_used_bytes": 0,
                "reclaimed_bytes": 0,
                "tiers": probe,
                "sessions": {},
            }
            stmt = insert(_SAMPLES).returning(_SAMPLES.c.id)
            probe_id = conn.execute(stmt, row).scalar_one()
            conn.execute(delete(_SAMPLES).where(_SAMPLES.c.id == probe_id))

    def warm_up(self) -> None:
        """What the first turn after a start would pay, paid at start (issue 21: it missed
        a vLLM connector's 50 ms budget): the database's first write, the WAL's (a probe,
        rolled back), and the new session's and event's INSERTs compiled."""
        self._prepared.prepare_insert(_SESSIONS, "seq", tuple(c for _, c in _SESSION_FIELDS))
        self._prepared.prepare_insert(_EVENTS, "id", tuple(c for _, c in _EVENT_FIELDS))
        self.probe()

    @staticmethod
    def revert(row: SessionRow) -> None:
        """Put the row's columns back as they were last written (after a failed save)."""
        written: dict[str, Any] | None = getattr(row, _WRITTEN, None)
        if written is None:
            return
        for attr, value in written.items():
            if getattr(row, attr) != value:
                setattr(row, attr, value)

    def insert(self, row: SessionRow, event: EventRow) -> None:
        """Insert a new session and its first event; ``row.seq`` is set on return.

        Raises sqlalchemy's IntegrityError when (tenant, session_id) exists already.
        """
        self.write_many([(row, (event,), True)])

    def save(self, row: SessionRow, *events: EventRow) -> None:
        """Write the row's changed columns and the events that explain them, atomically."""
        self.write_many([(row, events, False)])

    def write_many(self, items: Sequence[tuple[SessionRow, Sequence[EventRow], bool]]) -> None:
        """Rows with their events, in ONE transaction (all or none): ``(row, events,
        insert)``, a new row inserted (``seq`` set) or a known one's changed columns
        written. A batch of moves commits its sessions this way."""
        written: list[dict[str, Any]] = []
        with self._writing() as conn:
            for row, events, new in items:
                values = {attr: getattr(row, attr) for attr, _ in _SESSION_FIELDS}
                if new:
                    by_column = _by_column(values, _SESSION_FIELDS)
                    row.seq = self._prepared.insert(conn, _SESSIONS, "seq", by_column)
                else:
                    last: dict[str, Any] | None = getattr(row, _WRITTEN, None)
                    changed = (
                        values
                        if last is None
                        else {k: v for k, v in values.items() if k not in last or last[k] != v}
                    )
                    if changed:
                        by_column = _by_column(changed, _SESSION_FIELDS)
                        self._prepared.update(conn, _SESSIONS, "seq", row.seq, by_column)
                self._insert_events(conn, row.seq, events)
                written.append(values)
        for (row, _, _), values in zip(items, written, strict=True):
            setattr(row, _WRITTEN, values)

    def _insert_events(
        self, conn: Connection, session_seq: int, events: Sequence[EventRow]
    ) -> None:
        for event in events:
            event.session_seq = session_seq
            values = {column: getattr(event, attr) for attr, column in _EVENT_FIELDS}
            event.id = self._prepared.insert(conn, _EVENTS, "id", values)

    def get(self, tenant: str, session_id: str) -> SessionRow | None:
        with self._factory() as db:
            stmt = select(SessionRow).where(
                SessionRow.tenant == tenant, SessionRow.session_id == session_id
            )
            return db.scalars(stmt).one_or_none()

    def get_many(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], SessionRow]:
        """The rows of these ``(tenant, session_id)`` that exist (one query)."""
        wanted = set(keys)
        if not wanted:
            return {}
        with self._factory() as db:
            stmt = select(SessionRow).where(SessionRow.session_id.in_({k[1] for k in wanted}))
            rows = db.scalars(stmt)
            return {k: r for r in rows if (k := (r.tenant, r.session_id)) in wanted}

    def knows_sessions(self) -> bool:
        """Whether the database holds any session row at all (deleted ones included)."""
        with self._engine.connect() as conn:
            return conn.execute(select(_SESSIONS.c.seq).limit(1)).first() is not None

    def live_rows(self) -> Sequence[SessionRow]:
        """Every session not deleted, oldest first: what the daemon re-attaches at start."""
        with self._factory() as db:
            stmt = (
                select(SessionRow).where(SessionRow.state != State.DELETED).order_by(SessionRow.seq)
            )
            return db.scalars(stmt).all()

    def page_ids(
        self, tenant: str, state: str | None, limit: int, after_seq: int
    ) -> list[tuple[int, str]]:
        """``(seq, session_id)`` of up to ``limit`` sessions with seq > after_seq, in order;
        deleted ones only when asked for. Ids only: live rows are in memory already."""
        stmt = select(_SESSIONS.c.seq, _SESSIONS.c.session_id).where(
            _SESSIONS.c.tenant == tenant, _SESSIONS.c.seq > after_seq
        )
        if state is None:
            stmt = stmt.where(_SESSIONS.c.state != State.DELETED)
        else:
            stmt = stmt.where(_SESSIONS.c.state == state)
        with self._engine.connect() as conn:
            found = conn.execute(stmt.order_by(_SESSIONS.c.seq).limit(limit)).all()
        return [(int(seq), str(session_id)) for seq, session_id in found]

    def rows_by_seq(self, seqs: Sequence[int]) -> dict[int, SessionRow]:
        """Rows (without their token log and logits) by seq, for listing the ones not live."""
        if not seqs:
            return {}
        with self._factory() as db:
            stmt = select(SessionRow).where(SessionRow.seq.in_(seqs))
            stmt = stmt.options(defer(SessionRow.token_log), defer(SessionRow.next_logits))
            return {row.seq: row for row in db.scalars(stmt)}

    def events(self, tenant: str, session_id: str | None, limit: int) -> Sequence[EventRow]:
        """The newest ``limit`` events of a tenant (or of one of its sessions), newest first."""
        with self._factory() as db:
            stmt = select(EventRow).where(EventRow.tenant == tenant)
            if session_id is not None:
                stmt = stmt.where(EventRow.session_id == session_id)
            return db.scalars(stmt.order_by(EventRow.id.desc()).limit(limit)).all()

    def events_after(self, tenant: str, after_id: int, limit: int) -> Sequence[EventRow]:
        """The tenant's events with id > ``after_id``, oldest first, up to ``limit``
        (an event stream resumed from its last id)."""
        with self._factory() as db:
            stmt = select(EventRow).where(EventRow.tenant == tenant, EventRow.id > after_id)
            return db.scalars(stmt.order_by(EventRow.id).limit(limit)).all()

    def last_request_ids(self, tenant: str, session_id: str, limit: int) -> list[str]:
        """The request ids of a session's newest ``limit`` turns, newest first."""
        last = func.max(_EVENTS.c.id).label("last")
        stmt = (
            select(_EVENTS.c.request_id, last)
            .where(
                _EVENTS.c.tenant == tenant,
                _EVENTS.c.session_id == session_id,
                _EVENTS.c.request_id.is_not(None),
            )
            .group_by(_EVENTS.c.request_id)
            .order_by(last.desc())
            .limit(limit)
        )
        with self._engine.connect() as conn:
            return [str(rid) for rid, _ in conn.execute(stmt)]

    def events_of_requests(self, tenant: str, request_ids: Sequence[str]) -> Sequence[EventRow]:
        """Every event of these request ids, oldest first."""
        if not request_ids:
            return []
        with self._factory() as db:
            stmt = select(EventRow).where(
                EventRow.tenant == tenant, EventRow.request_id.in_(request_ids)
            )
            return db.scalars(stmt.order_by(EventRow.id)).all()

    def request_events(self, tenant: str, request_id: str, limit: int) -> Sequence[EventRow]:
        """The newest ``limit`` events whose request id is ``request_id`` or starts with
        ``request_id + "-"`` (a range of the (tenant, request_id) index), oldest first."""
        with self._factory() as db:
            stmt = select(EventRow).where(
                EventRow.tenant == tenant,
                or_(
                    EventRow.request_id == request_id,
                    and_(
                        EventRow.request_id >= request_id + "-",
                        EventRow.request_id < request_id + ".",  # "." follows "-"
                    ),
                ),
            )
            found = db.scalars(stmt.order_by(EventRow.id.desc()).limit(limit)).all()
        return list(reversed(found))

    def tool_returns(self, per_tool: int) -> list[EventRow]:
        """The newest ``per_tool`` tool_return events of each tool, oldest first.

        Bounded whatever the table holds: the tools come from a loose scan of the
        ``events (kind, detail, id)`` index (one seek per tool), then each tool's newest
        rows from the same index backwards, so start-up reads tools x ``per_tool`` rows at
        most. The events handed out carry the kind, tool, duration and id only.
        """
        kind = EventKind.TOOL_RETURN.value
        newest = (
            select(_EVENTS.c.id, _EVENTS.c.detail, _EVENTS.c.duration_ms)
            .where(_EVENTS.c.kind == kind, _EVENTS.c.detail == bindparam("tool"))
            .order_by(_EVENTS.c.id.desc())
            .limit(per_tool)
        )
        found: list[tuple[int, str, float | None]] = []
        with self._engine.connect() as conn:
            for tool in distinct_event_values(conn, "detail", kind):
                found.extend(
                    (int(i), str(d), ms) for i, d, ms in conn.execute(newest, {"tool": tool})
                )
        found.sort()
        return [EventRow(id=id_, kind=kind, detail=tool, duration_ms=ms) for id_, tool, ms in found]


def _by_column(values: dict[str, Any], fields: list[tuple[str, str]]) -> dict[str, Any]:
    names = dict(fields)
    return {names[attr]: value for attr, value in values.items()}
