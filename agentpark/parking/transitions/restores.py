"""Restores: PARKED -> RESUMING, LOST -> RECOMPUTING, then ACTIVE (or back)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from agentpark.enums import EventKind, Reason, State
from agentpark.errors import InvalidStateError, StorageUnavailableError
from agentpark.parking.registry import LiveSession
from agentpark.parking.transitions.steps import Steps

__all__ = ["Restores"]


class Restores(Steps):
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
            self.free_slots(live, src_tier, cache=True)
        return elapsed_ms

    def restored_by_content(
        self, live: LiveSession, tier_name: str, nbytes: int, started: float, tokens: int
    ) -> None:
        """Any -> the same: an external engine loaded parked blocks found by content (not
        this session's own parked copy) into a request of this session: a ``resume``
        event saying so, with no change of state (the turn's end records the rest)."""
        row = live.row
        event = self.events.event(
            row,
            EventKind.RESUME,
            time.time(),
            from_state=row.state,
            to_state=row.state,
            from_tier=tier_name,
            reason=Reason.CONTENT,
            nbytes=nbytes,
            duration_ms=(time.perf_counter() - started) * 1e3,
            detail=f"tokens={tokens} by content",
        )
        self.commit(live, event)
