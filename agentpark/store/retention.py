"""Retention: old events, tool returns and deleted sessions leave SQLite in small batches.

SQLite has one writer. A single ``DELETE`` of a week of events would hold the write lock
for seconds and every pause, resume and create would wait behind it. Each step here
deletes at most ``retention.batch_rows`` rows per transaction, chosen through an index
(``events (kind, at)``, ``sessions (state, deleted_at)``, migration 0007), and commits
before the next batch, so a request waits for one batch at most.

- Events older than ``retention.events_h``, every kind but ``tool_return``.
- ``tool_return`` events (the learned pauses per tool) older than ``retention.tool_returns_h``.
- Deleted sessions whose delete is older than ``retention.deleted_h``: the row goes (token
  log, logits, metadata with it) and so do its events, except its tool returns, which keep
  teaching the pause of their tool (their ``session_seq`` becomes null). The id can then be
  created again; until the purge a deleted id answers as before (200 on GET, 409 on create).

Host samples keep ``dashboard.retention_h`` (:meth:`SampleStore.prune`, batched the same way).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from sqlalchemy import Engine, text

from agentpark.config import RetentionSettings
from agentpark.enums import EventKind, State

__all__ = ["Retention", "RetentionReport", "RetentionStore", "distinct_event_values"]

log = logging.getLogger(__name__)

# Upper bound on the distinct kinds (or tools) a loose index scan walks, however many exist.
MAX_DISTINCT = 4096


def distinct_event_values(conn: object, column: str, kind: str | None) -> list[str]:
    """Distinct values of ``events.<column>`` (of one ``kind``, or of ``kind`` itself) by a
    loose index scan: one index seek per value, not a scan of the rows.

    SQLite has no skip scan for DISTINCT; the recursive query asks the index for the
    smallest value above the previous one, at most :data:`MAX_DISTINCT` times.
    """
    if column not in ("kind", "detail"):
        raise ValueError(f"no loose scan over events.{column}")
    scope = "" if kind is None else "kind = :kind AND "
    sql = text(
        f"""
        WITH RECURSIVE walk(v, n) AS (
            SELECT (SELECT MIN({column}) FROM events WHERE {scope}{column} IS NOT NULL), 1
            UNION ALL
            SELECT (SELECT MIN({column}) FROM events WHERE {scope}{column} > walk.v), n + 1
            FROM walk WHERE walk.v IS NOT NULL AND n < :cap
        )
        SELECT v FROM walk WHERE v IS NOT NULL
        """
    )
    params: dict[str, object] = {"cap": MAX_DISTINCT}
    if kind is not None:
        params["kind"] = kind
    rows = conn.execute(sql, params).all()  # type: ignore[attr-defined]
    return [str(v) for (v,) in rows]


class RetentionStore:
    """The batched deletes; each call deletes at most one batch, in its own transaction."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def event_kinds(self) -> list[str]:
        with self._engine.connect() as conn:
            return distinct_event_values(conn, "kind", None)

    def prune_events(self, kind: str, before: float, limit: int) -> int:
        """Delete up to ``limit`` of the oldest events of ``kind`` with ``at < before``."""
        sql = text(
            "DELETE FROM events WHERE id IN (SELECT id FROM events "
            "WHERE kind = :kind AND at < :before ORDER BY at LIMIT :limit)"
        )
        with self._engine.begin() as conn:
            result = conn.execute(sql, {"kind": kind, "before": before, "limit": limit})
            return int(result.rowcount or 0)

    def purge_deleted(self, before: float, limit: int) -> int:
        """One batch of the purge of sessions deleted before ``before``; returns rows changed.

        In order, each step only once the one before has nothing left: the sessions'
        events but their tool returns are deleted, their tool returns unlinked (kept for
        the learned pauses), then the session rows deleted; ``limit`` rows at most in all,
        so a batch that changed fewer rows finished the purge.
        """
        due = "SELECT seq FROM sessions WHERE state = :deleted AND deleted_at < :before"
        params = {
            "deleted": State.DELETED.value,
            "before": before,
            "limit": limit,
            "tool": EventKind.TOOL_RETURN.value,
        }
        steps = (
            "DELETE FROM events WHERE id IN (SELECT id FROM events "
            f"WHERE session_seq IN ({due}) AND kind != :tool LIMIT :limit)",
            "UPDATE events SET session_seq = NULL WHERE id IN (SELECT id FROM events "
            f"WHERE session_seq IN ({due}) LIMIT :limit)",
            f"DELETE FROM sessions WHERE seq IN ({due} ORDER BY deleted_at LIMIT :limit)",
        )
        total = 0
        with self._engine.begin() as conn:
            for sql in steps:  # a step that did less than its budget has nothing left
                done = int(
                    conn.execute(text(sql), {**params, "limit": limit - total}).rowcount or 0
                )
                total += done
                if total >= limit:
                    break
        return total


@dataclass
class RetentionReport:
    """Rows removed by one :meth:`Retention.run`."""

    events: int = 0
    tool_returns: int = 0
    purged_rows: int = 0  # deleted sessions' rows and events removed, tool returns unlinked

    @property
    def total(self) -> int:
        return self.events + self.tool_returns + self.purged_rows


class Retention:
    """Runs every retention step to completion, one batch per transaction.

    ``should_stop`` is asked between batches (the sampler passes its stop check), so shutdown
    never waits for a long backlog: the rest is done on the next run.
    """

    def __init__(
        self,
        store: RetentionStore,
        settings: RetentionSettings,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self.store = store
        self.settings = settings
        self.should_stop = should_stop

    def run(self, now: float | None = None) -> RetentionReport:
        now = time.time() if now is None else now
        cfg = self.settings
        report = RetentionReport()
        for kind in self.store.event_kinds():
            tool = kind == EventKind.TOOL_RETURN
            before = now - (cfg.tool_returns_h if tool else cfg.events_h) * 3600.0
            done = self._drain(partial(self.store.prune_events, kind, before))
            if tool:
                report.tool_returns += done
            else:
                report.events += done
        report.purged_rows = self._drain(
            partial(self.store.purge_deleted, now - cfg.deleted_h * 3600.0)
        )
        if report.total:
            log.info(
                "retention: removed %d events and %d tool returns; purge of deleted "
                "sessions changed %d rows",
                report.events,
                report.tool_returns,
                report.purged_rows,
            )
        return report

    def _drain(self, step: Callable[[int], int]) -> int:
        """Call ``step(batch)`` until a batch comes back short (or a stop is asked)."""
        limit = self.settings.batch_rows
        total = 0
        while not self.should_stop():
            done = step(limit)
            total += done
            if done < limit:
                break
        return total
