"""Pause (park or keep) and move: the transitions that take KV off the pool or between tiers."""

from __future__ import annotations

import time
from collections.abc import Sequence

from agentpark.enums import Decision, EventKind, Reason, State, Tier, TierChoice
from agentpark.errors import (
    InvalidRequestError,
    InvalidStateError,
    StorageUnavailableError,
    TransferError,
)
from agentpark.parking.base import BACKGROUND_REASONS, INLINE_BYTES, CoreBase
from agentpark.parking.registry import LiveSession
from agentpark.parking.types import (
    MoveResult,
    PauseAdvice,
    PauseOrder,
    PauseResult,
    as_transfer_error,
)
from agentpark.store.models import EventRow, SessionRow
from agentpark.tiers.base import HostTier

__all__ = ["Pausing"]


class Pausing(CoreBase):
    """ACTIVE -> PAUSING -> PARKED, ACTIVE -> ACTIVE (kept), PARKED -> PARKED (moved)."""

    def pause(
        self,
        tenant: str,
        session_id: str,
        order: PauseOrder = PauseOrder(),  # noqa: B008 (frozen, so one default is safe)
        wait: bool = True,
    ) -> PauseResult:
        """Park the session's blocks in a host tier, or keep them when the pause is short.

        The decision is the advisor's (break-even, learned tool pauses), taken under the
        session's lock; ``force`` and background reasons (idle, pressure) always park.
        The tier's slots are reserved before anything moves (507 when no tier has room);
        with ``wait=False`` the copy runs in the background and the result says PAUSING.
        """
        if order.reason != Reason.DRAIN:
            self.refuse_if_draining()
        candidates = self.mover.candidates(order.tier)
        live = self.live(tenant, session_id)
        self.registry.acquire(live, "pause", background=order.reason in BACKGROUND_REASONS)
        started = self._start_pause(live, order, candidates)
        if isinstance(started, PauseResult):
            return started
        dst, slots, advice = started
        row = live.row

        def job() -> PauseResult:
            ms = self.park_locked(live, dst, slots, order.tool, advice.expected_s, order.reason)
            return PauseResult(row, Decision.PARKED, advice.why, advice.expected_s, ms)

        return self._run(
            live, job, wait, PauseResult(row, Decision.PARKED, advice.why, advice.expected_s, None)
        )

    def pause_now(
        self,
        tenant: str,
        session_id: str,
        order: PauseOrder = PauseOrder(),  # noqa: B008 (frozen, so one default is safe)
    ) -> PauseResult | None:
        """:meth:`pause` with ``wait``, run here only if nothing in it can wait: None, with
        nothing changed, when it could (the caller then runs :meth:`pause` on a worker).

        The event loop calls this so that a small pause costs no thread hand-off. It goes
        on only for a user pause of at most ``INLINE_BYTES`` of KV, with the engine free
        (no decode step or copy holds it: it is then held to the end, so the copy cannot
        wait for it), the session free (no holder, nobody waiting), and a tier with room
        that is not disk (whose landing fsyncs). The one wait left is SQLite's, behind
        another writer's transaction (each a fraction of a millisecond; checkpoints are
        passive). Errors are the same as :meth:`pause`'s.
        """
        if order.reason != Reason.EXPLICIT:
            return None
        self.refuse_if_draining()
        candidates = self.mover.candidates(order.tier)
        live = self.live(tenant, session_id)
        if len(live.block_table) * self.geometry.block_nbytes > INLINE_BYTES:
            return None
        with self.host.engine_lock_now() as engine_free:
            if not engine_free or not self.registry.try_acquire(live, "pause"):
                return None
            started = self._start_pause(live, order, candidates)
            if isinstance(started, PauseResult):
                return started
            dst, slots, advice = started
            if dst.name == Tier.DISK:  # its landing fsyncs: not on the event loop
                dst.free(live.key)
                live.row.state = State.ACTIVE
                self.registry.release(live)
                return None
            try:
                ms = self.park_locked(live, dst, slots, order.tool, advice.expected_s, order.reason)
            finally:
                self.registry.release(live)
            return PauseResult(live.row, Decision.PARKED, advice.why, advice.expected_s, ms)

    def _start_pause(
        self, live: LiveSession, order: PauseOrder, candidates: Sequence[HostTier]
    ) -> PauseResult | tuple[HostTier, list[int], PauseAdvice]:
        """The decision, taken with the session held: a finished result (already off the
        pool, or kept; the session let go), or the tier slots reserved for the copy (the
        session PAUSING, still held). On an error the session is let go."""
        try:
            row = live.row
            if row.state in (State.PARKED, State.LOST):
                self.registry.release(live)
                return PauseResult(row, Decision.PARKED, "already off the pool", None, 0.0)
            if row.state != State.ACTIVE:
                raise InvalidStateError(f"cannot pause in state {row.state}", state=row.state)
            advice = self._advise(row, order)
            if not advice.park:
                self.keep_locked(live, order.tool, advice.expected_s, advice.why)
                self.registry.release(live)
                return PauseResult(row, Decision.KEPT, advice.why, advice.expected_s, 0.0)
            dst, slots = self.mover.reserve(live.key, candidates, len(live.block_table))
            row.state = State.PAUSING
        except BaseException:
            if live.operation is not None:
                self.registry.release(live)
            raise
        return dst, slots, advice

    def _advise(self, row: SessionRow, order: PauseOrder) -> PauseAdvice:
        if order.force:
            return PauseAdvice(True, "forced by the caller", order.expected_resume_s)
        if order.reason != Reason.EXPLICIT:
            return PauseAdvice(True, f"policy: {order.reason}", order.expected_resume_s)
        if self.advisor is None:
            return PauseAdvice(True, "no policy: every pause parks", order.expected_resume_s)
        return self.advisor(row.kv_bytes, order.tool, order.expected_resume_s)

    def park_locked(
        self,
        live: LiveSession,
        dst: HostTier,
        slots: list[int],
        tool: str | None,
        expected_resume_s: float | None,
        reason: str,
    ) -> float:
        """Copy the session's blocks into ``slots`` of ``dst`` and commit PARKED.

        The caller holds the session and reserved the slots; on failure they are freed
        and the session is ACTIVE again, its blocks untouched. Returns the milliseconds.
        """
        row = live.row
        started = time.perf_counter()
        blocks = list(live.block_table)
        try:
            source = self._endpoint()
            fused = self.mover.copy(source, blocks, dst, slots, hash=self.mover.checksummed(dst))
            digest = self.mover.land(dst, slots, fused)
        except Exception as exc:
            dst.free(live.key)
            row.state = State.ACTIVE
            self.events.failure(row, EventKind.PAUSE_FAILED, exc, at=time.time(), to_tier=dst.name)
            raise as_transfer_error("pause", exc) from exc
        try:
            self.commit_parked(
                live, dst, slots, digest, len(blocks), started, tool, expected_resume_s, reason
            )
        except StorageUnavailableError:  # the row is ACTIVE again; so is the rest
            dst.free(live.key)
            live.slots = []
            raise
        self.release_blocks(live)  # only once the commit says the copy holds the KV
        return (time.perf_counter() - started) * 1e3

    def commit_parked(
        self,
        live: LiveSession,
        dst: HostTier,
        slots: list[int],
        digest: str | None,
        num_blocks: int,
        started: float,
        tool: str | None,
        expected_resume_s: float | None,
        reason: str,
        prior: Sequence[EventRow] = (),
    ) -> None:
        """The copy is in ``slots`` of ``dst`` and the pool's blocks are gone: say PARKED.

        ``prior``: events not yet committed that go first in the same write (an external
        engine's turn end).
        """
        row = live.row
        live.slots = slots
        now = time.time()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        nbytes = num_blocks * self.geometry.block_nbytes
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
        row.state, row.tier, row.tier_since = State.PARKED, dst.name, now
        self.mover.measured(nbytes, elapsed_ms)
        row.pause_count += 1
        if reason == Reason.EXPLICIT or row.tool is None:
            # A new wait starts here; a policy pause of a session already waiting on its
            # tool (kept at first, parked later) keeps the wait's start and estimate.
            row.paused_at, row.tool = now, tool
            row.expected_resume_at = None if expected_resume_s is None else now + expected_resume_s
        row.parked_handle = {"slots": slots}
        row.checksum = digest
        row.kv_blocks, row.kv_bytes = num_blocks, nbytes
        self.events.commit(row, *prior, event)

    def keep_locked(
        self,
        live: LiveSession,
        tool: str | None,
        expected_resume_s: float | None,
        why: str,
        prior: Sequence[EventRow] = (),
    ) -> None:
        """Record a pause the advisor decided not to park: the KV stays in the pool.

        ``prior``: events committed in the same write, before the keep (an external
        engine's turn and tool return).

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
        self.events.commit(row, *prior, event)

    def move(
        self, tenant: str, session_id: str, tier: str, reason: str = Reason.EXPLICIT
    ) -> MoveResult:
        """Move a parked session's copy to another tier (drain, demotion, operator)."""
        if reason not in (Reason.DRAIN, Reason.DEMOTE):
            self.refuse_if_draining()
        live = self.live(tenant, session_id)
        if tier == TierChoice.AUTO:
            raise InvalidRequestError("move needs a tier name, not auto")
        (dst,) = self.mover.candidates(tier)
        with self.registry.operation(live, "move", background=reason in BACKGROUND_REASONS):
            return self.move_locked(live, [dst], reason)

    def move_locked(
        self, live: LiveSession, candidates: Sequence[HostTier], reason: str
    ) -> MoveResult:
        row = live.row
        if row.state != State.PARKED:
            raise InvalidStateError(
                f"only a parked session can move; this one is {row.state}", state=row.state
            )
        src = self.tiers[row.tier or ""]
        if src in candidates:
            return MoveResult(row, src.name, 0.0)
        started = time.perf_counter()
        others = [t for t in candidates if t is not src]
        dst, slots = self.mover.reserve(live.key, others, len(live.slots))
        try:
            fused = self.mover.copy(src, live.slots, dst, slots, hash=self.mover.checksummed(dst))
            digest = self.mover.land(dst, slots, fused)
        except Exception as exc:
            dst.free(live.key)
            self.events.failure(row, EventKind.MOVE_FAILED, exc, at=time.time(), to_tier=dst.name)
            raise as_transfer_error("move", exc) from exc
        if not self.mover.same_copy(dst, slots, digest, row.checksum):
            # The copy we moved from was already damaged: do not keep a bad copy.
            dst.free(live.key)
            self.drop_corrupt(live, src.name)
            raise TransferError(
                f"the parked copy in {src.name} failed its checksum; the session is lost "
                "and will be recomputed on resume"
            )
        now = time.time()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        event = self.events.event(
            row,
            EventKind.MOVE,
            now,
            from_state=State.PARKED,
            to_state=State.PARKED,
            from_tier=src.name,
            to_tier=dst.name,
            reason=reason,
            nbytes=row.kv_bytes,
            duration_ms=elapsed_ms,
        )
        row.tier, row.parked_handle, row.tier_since = dst.name, {"slots": slots}, now
        row.checksum = digest or row.checksum
        try:
            self.events.commit(row, event)
        except StorageUnavailableError:  # the row names the old copy again: keep it
            dst.free(live.key)
            raise
        src.free(live.key)
        live.slots = slots
        return MoveResult(row, src.name, elapsed_ms)
