"""Resume: PARKED -> RESUMING -> ACTIVE, or LOST -> RECOMPUTING -> ACTIVE."""

from __future__ import annotations

import time

from agentpark.enums import Reason, RestoredFrom, State, Tier
from agentpark.errors import InvalidStateError, TransferError
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
                    self.transitions.tool_return(live)
                self.registry.release(live)
                return ResumeResult(row, RestoredFrom.POOL, 0.0)
            if row.state not in (State.PARKED, State.LOST):
                raise InvalidStateError(f"cannot resume in state {row.state}", state=row.state)
            if self.engine is None:
                raise InvalidStateError(
                    "this session's KV lives in an external engine: it is restored into the "
                    "engine's blocks on the session's next turn, not by resume"
                )
            blocks = self.engine.claim(live, self.geometry.blocks_for(len(live.tokens)))
            source = RestoredFrom(row.tier) if row.tier else RestoredFrom.RECOMPUTE
            self.transitions.begin_restore(live)
        except BaseException:
            if live.operation is not None:
                self.registry.release(live)
            raise

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
        engine = self.engine
        live = self.live(tenant, session_id)
        n = self.geometry.blocks_for(len(live.tokens))
        if engine is None or not _inline(live, n * self.geometry.block_nbytes):
            return None
        with engine.engine_lock_now() as engine_free:
            if not engine_free or not self.registry.try_acquire(live, "resume"):
                return None
            try:
                # Again, now that the session is held: it may have moved meanwhile.
                blocks = engine.claim_now(live, n) if _inline(live, 0) else None
            except BaseException:
                self.registry.release(live)
                raise
            if blocks is None:
                self.registry.release(live)
                return None
            try:
                self.transitions.begin_restore(live)
                return self.restore_locked(live, blocks, Reason.EXPLICIT)
            finally:
                self.registry.release(live)

    def restore_locked(self, live: LiveSession, blocks: list[int], reason: str) -> ResumeResult:
        """Restore a RESUMING or RECOMPUTING session (:meth:`Transitions.begin_restore`)
        into ``blocks``, already claimed for it: copy the parked copy, or recompute."""
        row = live.row
        started = time.perf_counter()
        parked = row.tier is not None
        from_state = State.PARKED if parked else State.LOST
        from_tier = row.tier
        try:
            if parked and not self._restore_copy(live, blocks):
                parked = False  # the copy is damaged: recompute instead, and say why
                self.transitions.must_recompute(live)
            if not parked and live.tokens:
                if self.engine is None:
                    raise TransferError("the engine recomputes what is not parked")
                self.engine.recompute(live, blocks)
        except Exception as exc:
            self.transitions.abort_restore(live, blocks, exc, from_tier)
            raise as_transfer_error("resume", exc) from exc
        restored_from = RestoredFrom(from_tier or "") if parked else RestoredFrom.RECOMPUTE
        elapsed_ms = self.transitions.finish_restore(
            live,
            blocks,
            reason=reason,
            started=started,
            from_state=from_state,
            recomputed=not parked,
            tool_return=reason not in (Reason.PREFETCH, Reason.GENERATE),
        )
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
        if self.mover.restore(tier, slots, live.slots, self.endpoint(), blocks, live.expected):
            return True
        self.transitions.lose_corrupt(live, tier.name)
        return False
