"""The source's hand-over record (``moves`` table): which moves it started, how far.

=============  ==========================================================================
sending        the manifest or blocks are on their way: the session is the source's
committing     the commit was asked of the target and its answer not yet seen: the
               target may own the session; the source serves nothing of it
done           the source dropped its copy (or the target refused): nothing left to do
=============  ==========================================================================

The target's record is its session row with the ``moved_in`` event of the move, written
in one transaction (agentpark.parking.transitions.moves): whoever finds that event owns
the session.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy import Table, insert, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import sessionmaker

from agentpark.store.models import MoveRow

__all__ = ["COMMITTING", "DONE", "SENDING", "MoveRecords"]

SENDING, COMMITTING, DONE = "sending", "committing", "done"
_MOVES: Table = MoveRow.__table__  # type: ignore[assignment]


class MoveRecords:
    """The ``moves`` rows of this daemon's database, on an engine of their own."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._factory = sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def open(cls, database_url: str) -> MoveRecords:
        from agentpark.store.db import open_database

        engine, _ = open_database(database_url)
        return cls(engine)

    def close(self) -> None:
        self.engine.dispose()

    def start(self, move_id: str, tenant: str, session_id: str, peer: str) -> None:
        self.start_many([(move_id, tenant, session_id)], peer)

    def start_many(self, moves: Sequence[tuple[str, str, str]], peer: str) -> None:
        """``(move id, tenant, session id)`` of a batch to ``peer``, in one transaction."""
        if not moves:
            return
        now = time.time()
        rows = [
            {
                "move_id": move_id,
                "tenant": tenant,
                "session_id": session_id,
                "peer": peer,
                "state": SENDING,
                "started_at": now,
            }
            for move_id, tenant, session_id in moves
        ]
        # Core, not the ORM: a batch's records are on a move's critical path (the ORM's
        # unit of work cost a millisecond a batch here).
        with self.engine.begin() as conn:
            conn.execute(insert(_MOVES), rows)

    def mark(self, move_id: str, state: str) -> None:
        self.mark_many([move_id], state)

    def mark_many(self, move_ids: Sequence[str], state: str) -> None:
        """Every move of a batch to ``state``, in one transaction."""
        if not move_ids:
            return
        finished = time.time() if state == DONE else None
        with self.engine.begin() as conn:
            conn.execute(
                update(_MOVES)
                .where(_MOVES.c.move_id.in_(list(move_ids)))
                .values(state=state, finished_at=finished)
            )

    def open_for(self, tenant: str, session_id: str) -> MoveRow | None:
        """The session's move not done, if any (the newest)."""
        return self.open_for_many([(tenant, session_id)]).get((tenant, session_id))

    def open_for_many(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], MoveRow]:
        """Each session's newest move not done, of those that have one (one query)."""
        wanted = set(keys)
        found: dict[tuple[str, str], MoveRow] = {}
        if not wanted:
            return found
        stmt = (
            select(MoveRow)
            .where(MoveRow.state != DONE, MoveRow.session_id.in_({k[1] for k in wanted}))
            .order_by(MoveRow.started_at)
        )
        with self._factory() as db:
            for row in db.scalars(stmt):
                if (row.tenant, row.session_id) in wanted:
                    found[row.tenant, row.session_id] = row  # the newest last
        return found

    def unfinished(self) -> list[MoveRow]:
        with self._factory() as db:
            stmt = select(MoveRow).where(MoveRow.state != DONE).order_by(MoveRow.started_at)
            return list(db.scalars(stmt))
