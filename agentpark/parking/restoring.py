"""Resume: PARKED -> RESUMING -> ACTIVE, or LOST -> RECOMPUTING -> ACTIVE."""

from __future__ import annotations

import time

from agentpark.enums import EventKind, Reason, RestoredFrom, State, Tier
from agentpark.errors import (
    InvalidStateError,
    StorageUnavailableError,
)
from agentpark.parking.base import BACKGROUND_REASONS, INLINE_BYTES, CoreBase
from agentpark.parking.registry import LiveSession
from agentpark.parking.types import (
    ResumeResult,
    as_transfer_error,
)

__all__ = ["Restoring"]


def _inline(live: LiveSession, nbytes: int) -> bool:
    """Whether a resume may run on the event loop: parked in dram or shm, small enough."""
    row = live.row
    return (
        row.state == State.PARKED and row.tier in (Tier.DRAM, Tier.SHM) and nbytes <= INLINE_BYTES
    )


class Restoring(CoreBase):
    """Bring a session's KV back into the pool: copy it, or recompute it from its tokens."""

    def resume(
        self, tenant: str, session_id: str, reason: str = Reason.EXPLICIT, wait: bool = True
    ) -> ResumeResult:
        """Bring the session's KV back into the pool (copy, or recompute if it is gone)."""
        self.refuse_if_draining()
        live = self.live(tenant, session_id)
        self.registry.acquire(live, "resume", background=reason in BACKGROUND_REASONS)
        try:
            row = live.row
            if row.state == State.ACTIVE:
                if reason != Reason.PREFETCH:
                    self.observe_tool_return(live)
                self.registry.release(live)
                return ResumeResult(row, RestoredFrom.POOL, 0.0)
            if row.state not in (State.PARKED, State.LOST):
                raise InvalidStateError(f"cannot resume in state {row.state}", state=row.state)
            blocks = self.host.claim(live, self.geometry.blocks_for(len(live.tokens)))
        except BaseException:
            if live.operation is not None:
                self.registry.release(live)
            raise
        source = RestoredFrom(row.tier) if row.tier else RestoredFrom.RECOMPUTE
        row.state = State.RESUMING if row.state == State.PARKED else State.RECOMPUTING

        def job() -> ResumeResult:
            return self.restore_locked(live, blocks, reason)

        return self._run(live, job, wait, ResumeResult(row, source, None))

    def resume_now(self, tenant: str, session_id: str) -> ResumeResult | None:
        """:meth:`resume` with ``wait``, run here only if nothing in it can wait: None, with
        nothing changed, when it could (the caller then runs :meth:`resume` on a worker).

        Like :meth:`~agentpark.parking.pausing.Pausing.pause_now`: a user resume of a
        parked copy of at most ``INLINE_BYTES`` in dram or shm (not disk, whose pages may
        need reading; not a lost session, which recomputes), with the engine and the
        session free and the blocks free now with nobody queued for blocks. A copy whose
        checksum does not match is still recomputed here (rare, and a session this small
        re-prefills in a few milliseconds).
        """
        self.refuse_if_draining()
        live = self.live(tenant, session_id)
        n = self.geometry.blocks_for(len(live.tokens))
        if not _inline(live, n * self.geometry.block_nbytes):
            return None
        with self.host.engine_lock_now() as engine_free:
            if not engine_free or not self.registry.try_acquire(live, "resume"):
                return None
            try:
                # Again, now that the session is held: it may have moved meanwhile.
                blocks = self.host.claim_now(live, n) if _inline(live, 0) else None
            except BaseException:
                self.registry.release(live)
                raise
            if blocks is None:
                self.registry.release(live)
                return None
            try:
                return self.restore_locked(live, blocks, Reason.EXPLICIT)
            finally:
                self.registry.release(live)

    def restore_locked(
        self, live: LiveSession, blocks: list[int], reason: str, keep_tokens: int | None = None
    ) -> ResumeResult:
        """Restore a PARKED or LOST session into ``blocks`` (already claimed for it).

        ``keep_tokens``: restore only that prefix of the token log (whole blocks, one per
        entry of ``blocks``); the session then holds just those tokens.
        """
        row = live.row
        started = time.perf_counter()
        old_tokens, old_logits = live.tokens, live.next_logits  # put back if refused
        parked = row.tier is not None
        from_state = State.PARKED if parked else State.LOST
        from_tier = row.tier
        row.state = State.RESUMING if parked else State.RECOMPUTING
        try:
            if parked and not self._restore_copy(live, blocks):
                parked = False  # the copy is damaged: recompute instead, and say why
                row.state = State.RECOMPUTING
            if parked:
                restored_from = RestoredFrom(from_tier or "")
            else:
                if live.tokens:
                    self.host.recompute(live, blocks)
                restored_from = RestoredFrom.RECOMPUTE
        except Exception as exc:
            self.host.release(live, blocks)
            row.state = State.PARKED if row.tier is not None else State.LOST
            self.events.failure(
                row, EventKind.RESTORE_FAILED, exc, at=time.time(), from_tier=from_tier
            )
            raise as_transfer_error("resume", exc) from exc
        recomputed = restored_from == RestoredFrom.RECOMPUTE
        src_tier = row.tier
        live.block_table = blocks
        if keep_tokens is not None:
            live.tokens = live.tokens[:keep_tokens]
        now = time.time()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        event = self.events.event(
            row,
            EventKind.RECOMPUTE if recomputed else EventKind.RESUME,
            now,
            from_state=from_state,
            to_state=State.ACTIVE,
            from_tier=row.tier,
            reason=reason,
            nbytes=len(blocks) * self.geometry.block_nbytes,
            duration_ms=elapsed_ms,
            detail=row.lost_reason if recomputed else None,
        )
        row.state, row.tier, row.parked_handle, row.lost_reason = State.ACTIVE, None, None, None
        row.checksum, row.tier_since = None, None
        row.last_active_at = now
        if not recomputed:
            self.mover.measured(event.bytes or 0, elapsed_ms)
        self.sync_kv(live, log_changed=recomputed or keep_tokens is not None)
        try:
            self.events.commit(row, event)
        except StorageUnavailableError:  # the row is as before: parked (or lost) again
            live.block_table = []
            live.tokens, live.next_logits = old_tokens, old_logits
            self.host.release(live, blocks)
            raise
        if not recomputed:  # only once the commit that stops referencing them is in
            self.free_slots(live, src_tier)
        if reason not in (Reason.PREFETCH, Reason.GENERATE):
            self.observe_tool_return(live)
        return ResumeResult(row, restored_from, elapsed_ms)

    def _restore_copy(self, live: LiveSession, blocks: list[int]) -> bool:
        """Copy the parked copy into ``blocks``, checked against its checksum as it goes.

        A mismatch, or a tier file removed or replaced while running, marks the session
        LOST (its slots freed) and returns False: ``blocks`` then hold nothing usable, and
        the caller recomputes into them.
        """
        row = live.row
        tier = self.tiers[row.tier or ""]
        gone = self.tier_gone(tier)
        if gone is not None:  # the file was removed or replaced: the copy is not ours
            self.lose_copy(live, tier.name, gone)
            return False
        slots = live.slots[: len(blocks)]
        if self.mover.restore(tier, slots, live.slots, self._endpoint(), blocks, row.checksum):
            return True
        self.drop_corrupt(live, tier.name)
        return False
