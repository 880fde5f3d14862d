"""Every change of a session's state, in one place: the only code that assigns ``row.state``.

=================  =====================================================================
begin_park         ACTIVE -> PAUSING: tier slots reserved (all or nothing)
park_into          PAUSING -> PARKED: the mover copies, then finish_park commits
finish_park        PAUSING -> PARKED: the copy is in the slots (copied here or by an engine)
abort_park         PAUSING -> ACTIVE: the slots freed, a ``pause_failed`` event if it failed
keep               ACTIVE -> ACTIVE: a pause the advisor did not park
begin_restore      PARKED -> RESUMING, LOST -> RECOMPUTING
finish_restore     RESUMING | RECOMPUTING -> ACTIVE: the blocks hold the session's KV
abort_restore      RESUMING -> PARKED, RECOMPUTING -> LOST: a ``restore_failed`` event
lose               any -> LOST with a reason (checksum, tier file gone, drain, ttl, restart)
turn               PARKED | LOST | ACTIVE -> ACTIVE: an external engine computed a turn
tool_return        the agent is back from its tool: how long the tool took
delete             any -> DELETED
=================  =====================================================================

Pausing, restoring, the in-process driver's pressure relief, drain and the external
manager all call these; none of them writes a state itself. Each commits the row with the
events that explain it in one write, and updates the registry's tally of sessions by
state right where it changes the row (and again after a refused write, which puts the row
back): the tally is never a side effect of an attribute. A step that fails leaves the
session as it was, its blocks and slots included.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from agentpark.enums import EventKind, Reason, State
from agentpark.errors import InvalidStateError, StorageUnavailableError
from agentpark.parking.events import EventLog
from agentpark.parking.mover import Endpoint, Mover
from agentpark.parking.registry import LiveSession, StateTally
from agentpark.parking.types import KVHost, as_transfer_error
from agentpark.store.models import EventRow
from agentpark.tiers.base import HostTier

__all__ = ["Transitions"]

log = logging.getLogger(__name__)


class Transitions:
    """The state machine's edges over one core's event log, tally, mover and host.

    Every method expects the caller to hold the session (its registry operation).
    """

    def __init__(self, events: EventLog, tally: StateTally, mover: Mover, host: KVHost) -> None:
        self.events = events
        self.tally = tally
        self.mover = mover
        self.host = host

    # ---- writing ----------------------------------------------------------------------

    def commit(self, live: LiveSession, *events: EventRow) -> None:
        """Write the row with ``events``; the tally follows the row, written or put back."""
        try:
            self.events.commit(live.row, *events)
        finally:
            self.tally.update(live.row)

    def sync_kv(self, live: LiveSession, log_changed: bool = True) -> None:
        """Mirror the live KV state into the row; the token log only when it changed
        (re-encoding a long log is a millisecond a pause or restore need not pay)."""
        row = live.row
        if log_changed:
            row.num_tokens = len(live.tokens)
            row.token_log = np.asarray(live.tokens, dtype="<i4").tobytes()
            row.next_logits = None if live.next_logits is None else live.next_logits.tobytes()
        row.kv_blocks = len(live.block_table)
        row.kv_bytes = row.kv_blocks * self.host.geometry.block_nbytes
        self.tally.update(row)

    def _failed(
        self, live: LiveSession, kind: EventKind, exc: Exception, **tiers: str | None
    ) -> None:
        self.events.failure(live.row, kind, exc, at=time.time(), **tiers)
        self.tally.update(live.row)

    def free_slots(self, live: LiveSession, tier_name: str | None) -> None:
        tier = self.mover.tiers.get(tier_name or "")
        if tier is not None:
            tier.free(live.key)
        live.slots = []

    def release_blocks(self, live: LiveSession) -> None:
        if live.block_table:
            self.host.release(live, live.block_table)
        live.block_table = []

    # ---- park ---------------------------------------------------------------------------

    def begin_park(
        self, live: LiveSession, candidates: Sequence[HostTier]
    ) -> tuple[HostTier, list[int]]:
        """ACTIVE -> PAUSING: slots for every block in the first candidate with room.

        TierFullError (507) naming every tier tried, with nothing changed.
        """
        row = live.row
        if row.state != State.ACTIVE:
            raise InvalidStateError(f"cannot pause in state {row.state}", state=row.state)
        dst, slots = self.mover.reserve(live.key, candidates, len(live.block_table))
        row.state = State.PAUSING
        self.tally.update(row)
        return dst, slots

    def abort_park(
        self,
        live: LiveSession,
        dst: HostTier,
        failure: Exception | None = None,
        prior: Sequence[EventRow] = (),
    ) -> None:
        """PAUSING -> ACTIVE: the slots freed, the blocks untouched; ``failure`` recorded
        as a ``pause_failed`` event, ``prior`` (a turn's events) committed first."""
        row = live.row
        dst.free(live.key)
        live.slots = []
        row.state = State.ACTIVE
        self.tally.update(row)
        if prior:
            self.commit(live, *prior)
        if failure is not None:
            self._failed(live, EventKind.PAUSE_FAILED, failure, to_tier=dst.name)

    def park_into(
        self,
        live: LiveSession,
        source: Endpoint,
        dst: HostTier,
        slots: list[int],
        tool: str | None,
        expected_resume_s: float | None,
        reason: str,
    ) -> float:
        """PAUSING -> PARKED: copy the blocks from ``source`` into ``slots``, then commit.

        On a failed copy the park is aborted (ACTIVE, blocks untouched) and it raises.
        Returns the milliseconds.
        """
        started = time.perf_counter()
        blocks = list(live.block_table)
        try:
            fused = self.mover.copy(source, blocks, dst, slots, hash=self.mover.checksummed(dst))
            digest = self.mover.land(dst, slots, fused)
        except Exception as exc:
            self.abort_park(live, dst, exc)
            raise as_transfer_error("pause", exc) from exc
        return self.finish_park(live, dst, slots, digest, started, tool, expected_resume_s, reason)

    def park(
        self,
        live: LiveSession,
        source: Endpoint,
        candidates: Sequence[HostTier],
        tool: str | None,
        expected_resume_s: float | None,
        reason: str,
    ) -> float:
        """ACTIVE -> PARKED in one go: :meth:`begin_park`, then :meth:`park_into`."""
        dst, slots = self.begin_park(live, candidates)
        return self.park_into(live, source, dst, slots, tool, expected_resume_s, reason)

    def finish_park(
        self,
        live: LiveSession,
        dst: HostTier,
        slots: list[int],
        digest: str | None,
        started: float,
        tool: str | None,
        expected_resume_s: float | None,
        reason: str,
        prior: Sequence[EventRow] = (),
    ) -> float:
        """PAUSING -> PARKED: the copy of every block is in ``slots`` of ``dst``.

        The pool's blocks are let go only once the commit is in; a refused commit frees
        the slots and leaves the session ACTIVE with its blocks (and raises). ``prior``:
        events not yet committed that go first in the same write (an external engine's
        turn). Returns the milliseconds since ``started``.
        """
        row = live.row
        num_blocks = len(live.block_table)
        now = time.time()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        nbytes = num_blocks * self.host.geometry.block_nbytes
        event = self.events.event(
            row,
            EventKind.PAUSE,
            now,
            from_state=State.ACTIVE,
            to_state=State.PARKED,
            to_tier=dst.name,
            reason=reason,
            nbytes=nbytes,
            duration_ms=elapsed_ms,
            detail=f"tool={tool}" if tool else None,
        )
        live.slots = slots
        row.state, row.tier, row.tier_since = State.PARKED, dst.name, now
        row.pause_count += 1
        if reason in (Reason.EXPLICIT, Reason.TURN_END) or row.tool is None:
            # A new wait starts here; a policy pause of a session already waiting on its
            # tool (kept at first, parked later) keeps the wait's start and estimate.
            row.paused_at, row.tool = now, tool
            row.expected_resume_at = None if expected_resume_s is None else now + expected_resume_s
        row.parked_handle = {"slots": slots}
        row.checksum = digest
        row.kv_blocks, row.kv_bytes = num_blocks, nbytes
        try:
            self.commit(live, *prior, event)
        except StorageUnavailableError:  # the row is ACTIVE again; so is the rest
            dst.free(live.key)
            live.slots = []
            raise
        self.mover.measured(nbytes, elapsed_ms)
        self.release_blocks(live)  # only once the commit says the copy holds the KV
        return (time.perf_counter() - started) * 1e3

    def keep(
        self,
        live: LiveSession,
        tool: str | None,
        expected_resume_s: float | None,
        why: str,
        prior: Sequence[EventRow] = (),
    ) -> None:
        """ACTIVE -> ACTIVE: a pause the advisor did not park; the KV stays in the pool.

        The session is marked as waiting on its tool (paused_at, tool, expected resume),
        so the tool's real duration is learned when it returns, and the idle and pressure
        rules can still park it if the wait runs long or the pool needs the room.
        """
        row = live.row
        now = time.time()
        event = self.events.event(
            row,
            EventKind.KEEP,
            now,
            from_state=State.ACTIVE,
            to_state=State.ACTIVE,
            reason=Reason.BREAK_EVEN,
            nbytes=row.kv_bytes,
            detail=why,
        )
        row.paused_at, row.tool = now, tool
        row.expected_resume_at = None if expected_resume_s is None else now + expected_resume_s
        self.commit(live, *prior, event)

    # ---- restore ------------------------------------------------------------------------

    def begin_restore(self, live: LiveSession) -> None:
        """PARKED -> RESUMING, LOST -> RECOMPUTING (InvalidStateError from any other)."""
        row = live.row
        if row.state not in (State.PARKED, State.LOST):
            raise InvalidStateError(f"cannot resume in state {row.state}", state=row.state)
        row.state = State.RESUMING if row.tier is not None else State.RECOMPUTING
        self.tally.update(row)

    def must_recompute(self, live: LiveSession) -> None:
        """RESUMING -> RECOMPUTING: the copy turned out unusable (it was lost meanwhile)."""
        live.row.state = State.RECOMPUTING
        self.tally.update(live.row)

    def abort_restore(
        self,
        live: LiveSession,
        blocks: Sequence[int],
        failure: Exception,
        from_tier: str | None,
    ) -> None:
        """RESUMING -> PARKED, RECOMPUTING -> LOST: ``blocks`` go back to the engine and a
        ``restore_failed`` event says why."""
        row = live.row
        self.host.release(live, blocks)
        row.state = State.PARKED if row.tier is not None else State.LOST
        self.tally.update(row)
        self._failed(live, EventKind.RESTORE_FAILED, failure, from_tier=from_tier)

    def finish_restore(
        self,
        live: LiveSession,
        blocks: list[int],
        *,
        reason: str,
        started: float,
        from_state: State,
        recomputed: bool,
        tokens: list[int] | None = None,
        tool_return: bool = True,
        nbytes: int | None = None,
    ) -> float:
        """RESUMING | RECOMPUTING -> ACTIVE: ``blocks`` hold the KV of the session's tokens
        (``tokens``: its log is now that, a prefix of it or a whole turn).

        One write: the resume (or recompute) and, with ``tool_return``, the agent's
        return from its tool. The parked copy's slots are freed once it is in; refused,
        the blocks go back to the engine and the session is as it was. ``nbytes``: what
        was copied, when not all of ``blocks`` (an engine that had a prefix itself).
        Returns the milliseconds.
        """
        row = live.row
        src_tier = row.tier
        old = live.block_table, live.tokens, live.next_logits
        live.block_table = blocks
        if tokens is not None:
            live.tokens = tokens
        now = time.time()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        event = self.events.event(
            row,
            EventKind.RECOMPUTE if recomputed else EventKind.RESUME,
            now,
            from_state=from_state,
            to_state=State.ACTIVE,
            from_tier=src_tier,
            reason=reason,
            nbytes=len(blocks) * self.host.geometry.block_nbytes if nbytes is None else nbytes,
            duration_ms=elapsed_ms,
            detail=row.lost_reason if recomputed else None,
        )
        row.state, row.tier, row.parked_handle, row.lost_reason = State.ACTIVE, None, None, None
        row.checksum, row.tier_since = None, None
        row.last_active_at = now
        returned = self.tool_return_events(live, now) if tool_return else []
        self.sync_kv(live, log_changed=recomputed or tokens is not None)
        try:
            self.commit(live, event, *returned)
        except StorageUnavailableError:  # the row is as before: parked (or lost) again
            live.block_table, live.tokens, live.next_logits = old
            self.host.release(live, blocks)
            raise
        if not recomputed:  # only once the commit that stops referencing them is in
            self.mover.measured(event.bytes or 0, elapsed_ms)
            self.free_slots(live, src_tier)
        return elapsed_ms

    # ---- lose ---------------------------------------------------------------------------

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
        why = f"checksum mismatch in the {tier_name} tier: parked copy is damaged"
        log.error("session %s/%s: %s; recomputing", row.tenant, row.session_id, why)
        self.lose(live, Reason.CHECKSUM, why, kind=EventKind.CORRUPT)

    # ---- turns, tools, delete, start ----------------------------------------------------

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
            self.free_slots(live, row.tier)  # the engine computed this turn anyway
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

    def tool_return_events(self, live: LiveSession, now: float) -> list[EventRow]:
        """The agent is back from its tool: its ``tool_return`` event (how long the tool
        took, for learned pauses), unwritten; none when it was not waiting on one."""
        row = live.row
        if row.tool is None or row.paused_at is None:
            return []
        event = self.events.event(
            row,
            EventKind.TOOL_RETURN,
            now,
            to_state=row.state,
            detail=row.tool,
            duration_ms=(now - row.paused_at) * 1e3,
        )
        row.tool, row.expected_resume_at = None, None
        return [event]

    def tool_return(self, live: LiveSession) -> None:
        """:meth:`tool_return_events`, written."""
        events = self.tool_return_events(live, time.time())
        if events:
            self.commit(live, *events)

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
