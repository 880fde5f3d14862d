"""Queries for the host's history (host_samples) and the event figures the sampler reads.

Kept apart from :mod:`agentpark.store.repository` (sessions and their events) because the
sampler is the only writer of ``host_samples`` and it runs on its own thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import Engine, delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from agentpark.store.models import EventRow, HostSampleRow

__all__ = ["EventFigure", "SampleStore"]

# The event kinds the history and the latency figures are made of.
FIGURE_KINDS = ("pause", "resume", "recompute", "restore_failed")


@dataclass(frozen=True)
class EventFigure:
    """What the sampler needs of one event (no ORM object crosses threads)."""

    id: int
    kind: str
    at: float
    duration_ms: float | None
    bytes: int | None
    from_tier: str | None
    to_tier: str | None


class SampleStore:
    def __init__(self, engine: Engine, factory: sessionmaker[Session]) -> None:
        self._engine = engine
        self._factory = factory

    # ---- host_samples -----------------------------------------------------------------

    def insert(self, row: HostSampleRow) -> None:
        with self._factory.begin() as db:
            db.add(row)

    def latest(self) -> HostSampleRow | None:
        """The newest sample (by time, then by id)."""
        with self._factory() as db:
            stmt = select(HostSampleRow).order_by(HostSampleRow.at.desc(), HostSampleRow.id.desc())
            return db.scalars(stmt.limit(1)).one_or_none()

    def between(self, since: float, until: float) -> Sequence[HostSampleRow]:
        """Samples with ``since <= at <= until``, oldest first."""
        with self._factory() as db:
            stmt = (
                select(HostSampleRow)
                .where(HostSampleRow.at >= since, HostSampleRow.at <= until)
                .order_by(HostSampleRow.at, HostSampleRow.id)
            )
            return db.scalars(stmt).all()

    def finer_than(self, step_s: float, before: float) -> Sequence[HostSampleRow]:
        """Samples older than ``before`` whose resolution is finer than ``step_s``."""
        with self._factory() as db:
            stmt = (
                select(HostSampleRow)
                .where(HostSampleRow.at < before, HostSampleRow.step_s < step_s)
                .order_by(HostSampleRow.at, HostSampleRow.id)
            )
            return db.scalars(stmt).all()

    def replace(self, old: Iterable[HostSampleRow], new: Iterable[HostSampleRow]) -> None:
        """Delete ``old`` and insert ``new`` in one transaction (a downsampling step)."""
        ids = [row.id for row in old]
        with self._factory.begin() as db:
            for start in range(0, len(ids), 500):  # SQLite caps bound parameters
                chunk = ids[start : start + 500]
                db.execute(delete(HostSampleRow).where(HostSampleRow.id.in_(chunk)))
            db.add_all(list(new))

    def prune(self, before: float) -> int:
        """Delete samples older than ``before``; return how many."""
        with self._factory.begin() as db:
            result = db.execute(delete(HostSampleRow).where(HostSampleRow.at < before))
            return int(getattr(result, "rowcount", 0) or 0)

    def count(self) -> int:
        with self._factory() as db:
            return int(db.scalar(select(func.count()).select_from(HostSampleRow)) or 0)

    # ---- events (read only) -----------------------------------------------------------

    def max_event_id(self) -> int:
        with self._factory() as db:
            return int(db.scalar(select(func.max(EventRow.id))) or 0)

    def events_after(self, after_id: int, up_to_id: int | None = None) -> list[EventFigure]:
        """The figure events with ``after_id < id <= up_to_id``, in commit order.

        Event ids grow in commit order (SQLite has one writer), so an id watermark never
        misses an event committed late, which a time window could.
        """
        with self._factory() as db:
            stmt = select(*_FIGURE_COLUMNS).where(
                EventRow.id > after_id, EventRow.kind.in_(FIGURE_KINDS)
            )
            if up_to_id is not None:
                stmt = stmt.where(EventRow.id <= up_to_id)
            return [EventFigure(*r) for r in db.execute(stmt.order_by(EventRow.id)).all()]

    def events_between(self, since: float, until: float) -> list[EventFigure]:
        """The figure events with ``since <= at <= until`` (every tenant), oldest first."""
        with self._factory() as db:
            stmt = (
                select(*_FIGURE_COLUMNS)
                .where(EventRow.at >= since, EventRow.at <= until, EventRow.kind.in_(FIGURE_KINDS))
                .order_by(EventRow.id)
            )
            return [EventFigure(*r) for r in db.execute(stmt).all()]


_FIGURE_COLUMNS = (
    EventRow.id,
    EventRow.kind,
    EventRow.at,
    EventRow.duration_ms,
    EventRow.bytes,
    EventRow.from_tier,
    EventRow.to_tier,
)
