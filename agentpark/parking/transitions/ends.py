"""Losses, turns, deletes: any -> LOST, an external turn -> ACTIVE, any -> DELETED."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from agentpark.enums import EventKind, Reason, State
from agentpark.errors import InvalidStateError
from agentpark.parking.registry import LiveSession
from agentpark.parking.transitions.steps import Steps
from agentpark.store.models import EventRow

__all__ = ["Endings"]

log = logging.getLogger(__name__)


class Endings(Steps):
    def lose(
        self,
        live: LiveSession,
        reason: Reason,
        why: str,
        *,
        kind: EventKind = EventKind.LOST,
        commit: bool = True,
        free: bool = True,
        at: float | None = None,
    ) -> EventRow:
        """Any -> LOST with ``reason``: the session is recomputed from its tokens on its
        next turn. Returns its event.

        ``commit=False``: the event is returned unwritten and nothing is freed (start-up
        writes it its own way). Else the write comes first (refused: the row is back and
        nothing was freed), then the slots and blocks go, unless ``free`` is False (the
        caller forgets them: their tiers or pool are gone).
        """
        row = live.row
        tier = row.tier
        event = self.events.event(
            row,
            kind,
            time.time() if at is None else at,
            from_state=row.state,
            to_state=State.LOST,
            from_tier=tier,
            reason=reason,
            nbytes=row.kv_bytes,
            detail=why,
        )
        row.state, row.tier, row.lost_reason = State.LOST, None, why
        row.kv_blocks = row.kv_bytes = 0
        row.parked_handle, row.checksum = None, None
        self.tally.update(row)
        if not commit:
            return event
        self.commit(live, event)
        if free:
            self.release_blocks(live)
            self.free_slots(live, tier)
        return event

    def lose_corrupt(self, live: LiveSession, tier_name: str) -> None:
        """The parked copy failed its checksum: a ``corrupt`` event, LOST, slots freed."""
        row = live.row
        tier = self.mover.tiers.get(tier_name)
        if tier is not None:  # its blocks are not what their keys say: never shared again
            tier.forget(live.slots)
        why = f"checksum mismatch in the {tier_name} tier: parked copy is damaged"
        log.error("session %s/%s: %s; recomputing", row.tenant, row.session_id, why)
        self.lose(live, Reason.CHECKSUM, why, kind=EventKind.CORRUPT)

    def turn(
        self, live: LiveSession, tokens: Sequence[int], block_ids: Sequence[int]
    ) -> list[EventRow]:
        """An external engine computed a turn: the session holds ``tokens`` in
        ``block_ids`` (ACTIVE). A parked copy is stale now and is freed.

        Returns the turn's events for the caller to commit with the turn's outcome (one
        write per turn end); a freed copy's are committed here at once (its slots must not
        stay claimed in SQLite).
        """
        row = live.row
        stale = row.state == State.PARKED
        stale_tier = row.tier if stale else None
        if stale:
            self.free_slots(live, row.tier, cache=True)  # the engine computed this turn anyway
            row.tier, row.parked_handle, row.checksum, row.tier_since = None, None, None, None
        elif row.state not in (State.ACTIVE, State.LOST):
            raise InvalidStateError(f"cannot end a turn in state {row.state}", state=row.state)
        now = time.time()
        from_state = row.state
        live.tokens = list(tokens)
        live.block_table = list(block_ids)
        live.next_logits = None
        row.state, row.lost_reason, row.last_active_at = State.ACTIVE, None, now
        events = self.tool_return_events(live, now)
        self.sync_kv(live)
        events.append(
            self.events.event(
                row,
                EventKind.TURN,
                now,
                from_state=from_state,
                to_state=State.ACTIVE,
                from_tier=stale_tier,  # a parked copy this turn made stale was dropped
                nbytes=row.kv_bytes,
                detail=f"tokens={len(tokens)} blocks={len(block_ids)}",
            )
        )
        if stale:
            self.commit(live, *events)
            return []
        return events

    def delete(self, live: LiveSession) -> None:
        """Any -> DELETED: written first (refused: nothing freed), then blocks and slots go."""
        row = live.row
        now = time.time()
        tier = row.tier
        event = self.events.event(
            row,
            EventKind.DELETE,
            now,
            to_state=State.DELETED,
            from_tier=tier,
            nbytes=row.kv_bytes,
        )
        row.state, row.tier, row.deleted_at = State.DELETED, None, now
        row.kv_blocks = row.kv_bytes = 0
        row.parked_handle = None
        self.commit(live, event)
        self.release_blocks(live)
        self.free_slots(live, tier)

    def settle_at_start(self, live: LiveSession) -> None:
        """A row left in flight (pausing, resuming) by the last process, with no tokens and
        so no KV to lose: ACTIVE (before the registry counts it)."""
        live.row.state = State.ACTIVE
        self.events.store.save(live.row)
