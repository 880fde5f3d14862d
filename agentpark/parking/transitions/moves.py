"""Moves between daemons: PARKED (or LOST) -> DELETED here (moved out), none -> PARKED
(moved in).

A session handed to another daemon leaves this one the way a delete does (its row kept as
history, its slots freed), with a ``moved_out`` event naming the target and the move. The
daemon that takes it over writes the session's row PARKED, with its token log, metadata,
tool and expected resume, and a ``moved_in`` event naming the source and the move, in one
write: that row is the target's record that it owns the session.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from agentpark.enums import EventKind, Reason, State
from agentpark.errors import InvalidStateError
from agentpark.parking.handles import copy_checksum, parked_handle
from agentpark.parking.registry import LiveSession
from agentpark.parking.transitions.steps import Steps
from agentpark.store.models import EventRow, SessionRow
from agentpark.tiers.base import HostTier

__all__ = ["MovedIn", "Moves", "move_detail"]


def move_detail(direction: str, peer: str, move_id: str) -> str:
    """The detail of a move's event: ``to=URL move=ID`` or ``from=URL move=ID``."""
    return f"{direction}={peer} move={move_id}"


@dataclass
class MovedIn:
    """One session a target takes over: its row (filled with what the source sent, in
    ``live``), where its verified blocks are, and the move that brought them."""

    live: LiveSession
    tier: HostTier
    slots: Sequence[int]
    keys: Sequence[Hashable | None]
    digests: Sequence[str | None]
    peer: str
    move_id: str
    nbytes: int
    duration_ms: float
    revive: bool


class Moves(Steps):
    def moved_out(self, live: LiveSession, peer: str, move_id: str) -> None:
        """PARKED -> DELETED: the target committed the session; its copy here is dropped
        (LOST: a move in doubt across a restart that lost the copy here)."""
        self.moved_out_many([live], peer, [move_id])

    def moved_out_many(
        self, lives: Sequence[LiveSession], peer: str, move_ids: Sequence[str]
    ) -> None:
        """:meth:`moved_out` of a batch, its rows written in ONE transaction first (refused:
        nothing freed, every session stays parked here), then the slots go. The caller
        removes them from the registry."""
        for live in lives:
            if live.row.state not in (State.PARKED, State.LOST):
                raise InvalidStateError(
                    f"cannot move out in state {live.row.state}", state=live.row.state
                )
        now = time.time()
        tiers = [live.row.tier for live in lives]
        items: list[tuple[SessionRow, Sequence[EventRow], bool]] = []
        for live, move_id in zip(lives, move_ids, strict=True):
            row = live.row
            event = self.events.event(
                row,
                EventKind.MOVED_OUT,
                now,
                from_state=row.state,
                to_state=State.DELETED,
                from_tier=row.tier,
                reason=Reason.EXPLICIT,
                nbytes=row.kv_bytes,
                detail=move_detail("to", peer, move_id),
            )
            row.state, row.tier, row.deleted_at = State.DELETED, None, now
            row.kv_blocks = row.kv_bytes = 0
            row.parked_handle, row.checksum = None, None
            items.append((row, (event,), False))
        try:
            self.events.commit_many(items)
        finally:
            for live in lives:
                self.tally.update(live.row)
        for live, tier in zip(lives, tiers, strict=True):
            self.free_slots(live, tier)

    def moved_in(self, moved: MovedIn) -> None:
        """none (or a row deleted here before, e.g. moved out earlier) -> PARKED."""
        self.moved_in_many([moved])

    def moved_in_many(self, batch: Sequence[MovedIn]) -> None:
        """Each session -> PARKED in its tier, ONE transaction for the batch.

        Every block is in its slot and verified; each session's row is written with its
        ``moved_in`` event (``revive``: the row exists, deleted, and is updated; else
        inserted). Refused by the database: StorageUnavailableError, nothing written, the
        caller keeps the slots for a retry. The caller adds the sessions to the registry
        (which counts them).
        """
        now = time.time()
        block = self.host.geometry.block_nbytes
        items: list[tuple[SessionRow, Sequence[EventRow], bool]] = []
        for m in batch:
            row = m.live.row
            row.state, row.tier, row.tier_since = State.PARKED, m.tier.name, now
            row.deleted_at, row.lost_reason = None, None
            row.kv_blocks, row.kv_bytes = len(m.slots), len(m.slots) * block
            row.parked_handle = parked_handle(m.slots, m.keys, m.digests)
            row.checksum = copy_checksum(m.digests)
            event = self.events.event(
                row,
                EventKind.MOVED_IN,
                now,
                to_state=State.PARKED,
                to_tier=m.tier.name,
                reason=Reason.EXPLICIT,
                nbytes=m.nbytes,
                duration_ms=m.duration_ms,
                detail=move_detail("from", m.peer, m.move_id),
            )
            items.append((row, (event,), not m.revive))
        self.events.commit_many(items)
        for m in batch:
            m.live.slots, m.live.keys = list(m.slots), list(m.keys)
            m.live.digests = list(m.digests)
