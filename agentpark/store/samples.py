"""Queries for the host's history (host_samples) and the event figures the sampler reads.

Kept apart from :mod:`agentpark.store.repository` (sessions and their events) because the
sampler is the only writer of ``host_samples`` and it runs on its own thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

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

    def prune(self, before: float, batch_rows: int = 5000) -> int:
        """Delete samples older than ``before``, ``batch_rows`` per transaction (no long
        write lock); return how many."""
        oldest = (
            select(HostSampleRow.id)
            .where(HostSampleRow.at < before)
            .order_by(HostSampleRow.at)
            .limit(batch_rows)
        )
        total = 0
        while True:
            with self._factory.begin() as db:
                result = db.execute(delete(HostSampleRow).where(HostSampleRow.id.in_(oldest)))
                done = int(getattr(result, "rowcount", 0) or 0)
            total += done
            if done < batch_rows:
                return total

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

    def window_figures(self, since: float, until: float) -> dict[str, Any]:
        """What :func:`agentpark.history.transfer_figures` makes of the figure events with
        ``since <= at <= until``, computed in SQLite: a handful of rows come back however
        many events the window holds (``/v1/host/latency`` over a busy week).

        Counts, bytes and copy time are sums per kind over ``events (kind, at)``; each
        percentile is the nearest-rank row of the window's durations, as
        :func:`agentpark.tally.percentile` picks it.
        """
        window = (EventRow.at >= since, EventRow.at <= until)
        with self._engine.connect() as conn:
            stmt = (
                select(
                    EventRow.kind,
                    func.count(),
                    func.total(EventRow.bytes),
                    func.total(EventRow.duration_ms),
                )
                .where(EventRow.kind.in_(FIGURE_KINDS), *window)
                .group_by(EventRow.kind)
            )
            per_kind = {str(k): (int(n), int(b), float(ms)) for k, n, b, ms in conn.execute(stmt)}

            def count(kind: str) -> int:
                return per_kind.get(kind, (0, 0, 0.0))[0]

            def ranks(kinds: tuple[str, ...], n: int) -> tuple[float | None, float | None]:
                if n == 0:
                    return None, None
                wanted = [max(1, (n * p + 99) // 100) for p in (50, 99)]  # nearest rank
                duration = func.coalesce(EventRow.duration_ms, 0.0)
                ranked = (
                    select(
                        duration.label("d"),
                        func.row_number().over(order_by=(duration, EventRow.id)).label("rn"),
                    )
                    .where(EventRow.kind.in_(kinds), *window)
                    .subquery()
                )
                found = dict(
                    conn.execute(
                        select(ranked.c.rn, ranked.c.d).where(ranked.c.rn.in_(wanted))
                    ).all()
                )
                return float(found[wanted[0]]), float(found[wanted[1]])

            pause_p50, pause_p99 = ranks(("pause",), count("pause"))
            resume_p50, resume_p99 = ranks(
                ("resume", "recompute"), count("resume") + count("recompute")
            )
        return {
            "pauses": count("pause"),
            "resumes": count("resume"),
            "recomputes": count("recompute"),
            "restore_failures": count("restore_failed"),
            "bytes_parked": per_kind.get("pause", (0, 0, 0.0))[1],
            "bytes_restored": per_kind.get("resume", (0, 0, 0.0))[1],
            "park_ms": per_kind.get("pause", (0, 0, 0.0))[2],
            "restore_ms": per_kind.get("resume", (0, 0, 0.0))[2],
            "pause_p50_ms": pause_p50,
            "pause_p99_ms": pause_p99,
            "resume_p50_ms": resume_p50,
            "resume_p99_ms": resume_p99,
        }


_FIGURE_COLUMNS = (
    EventRow.id,
    EventRow.kind,
    EventRow.at,
    EventRow.duration_ms,
    EventRow.bytes,
    EventRow.from_tier,
    EventRow.to_tier,
)
