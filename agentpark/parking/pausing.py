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
from agentpark.parking.handles import copy_checksum, parked_handle
from agentpark.parking.registry import LiveSession
from agentpark.parking.types import (
    MoveResult,
    PauseAdvice,
    PauseOrder,
    PauseResult,
    as_transfer_error,
)
from agentpark.store.models import SessionRow
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
            ms = self.transitions.park_into(
                live, self.endpoint(), dst, slots, order.tool, advice.expected_s, order.reason
            )
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
        if order.reason != Reason.EXPLICIT or self.engine is None:
            return None
        self.refuse_if_draining()
        candidates = self.mover.candidates(order.tier)
        live = self.live(tenant, session_id)
        if len(live.block_table) * self.geometry.block_nbytes > INLINE_BYTES:
            return None
        with self.engine.engine_lock_now() as engine_free:
            if not engine_free or not self.registry.try_acquire(live, "pause"):
                return None
            started = self._start_pause(live, order, candidates)
            if isinstance(started, PauseResult):
                return started
            dst, slots, advice = started
            if dst.name == Tier.DISK:  # its landing fsyncs: not on the event loop
                self.transitions.abort_park(live, dst)
                self.registry.release(live)
                return None
            try:
                ms = self.transitions.park_into(
                    live, self.endpoint(), dst, slots, order.tool, advice.expected_s, order.reason
                )
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
            advice = self.advise(row, order)
            if not advice.park:
                self.transitions.keep(live, order.tool, advice.expected_s, advice.why)
                self.registry.release(live)
                return PauseResult(row, Decision.KEPT, advice.why, advice.expected_s, 0.0)
            dst, slots = self.transitions.begin_park(live, candidates)
        except BaseException:
            if live.operation is not None:
                self.registry.release(live)
            raise
        return dst, slots, advice

    def advise(self, row: SessionRow, order: PauseOrder) -> PauseAdvice:
        """Park or keep, and why: forced and the daemon's own pauses park; otherwise the
        advisor decides (break-even, learned tool pauses)."""
        if order.force:
            return PauseAdvice(True, "forced by the caller", order.expected_resume_s)
        if order.reason not in (Reason.EXPLICIT, Reason.TURN_END):
            return PauseAdvice(True, f"policy: {order.reason}", order.expected_resume_s)
        if self.advisor is None:
            return PauseAdvice(True, "no policy: every pause parks", order.expected_resume_s)
        return self.advisor(row.kv_bytes, order.tool, order.expected_resume_s)

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
        keys = live.keys or [None] * len(live.slots)
        dst, res = self.mover.reserve(live.key, others, keys)
        try:
            digests = self.mover.fill(src, live.slots, dst, res)
        except Exception as exc:
            dst.free(live.key)
            self.events.failure(row, EventKind.MOVE_FAILED, exc, at=time.time(), to_tier=dst.name)
            raise as_transfer_error("move", exc) from exc
        per_block = [
            digests.get(slot) if new else dst.digest_of(slot)
            for slot, new in zip(res.slots, res.fresh, strict=True)
        ]
        if not _same_copy(live.expected, per_block, res.fresh) or not self.mover.intact(
            src, live.slots, live.expected if isinstance(live.expected, str) else None
        ):
            # The copy we moved from was already damaged: do not keep a bad copy.
            dst.free(live.key)
            self.transitions.lose_corrupt(live, src.name)
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
            nbytes=len(digests) * self.geometry.block_nbytes,
            duration_ms=elapsed_ms,
        )
        row.tier, row.tier_since = dst.name, now
        row.parked_handle = parked_handle(res.slots, keys, per_block)
        row.checksum = copy_checksum(per_block) or row.checksum
        try:
            self.transitions.commit(live, event)
        except StorageUnavailableError:  # the row names the old copy again: keep it
            dst.free(live.key)
            raise
        dst.seal(live.key, digests)
        src.free(live.key)
        live.slots, live.digests = res.slots, per_block
        return MoveResult(row, src.name, elapsed_ms)


def _same_copy(
    expected: str | list[str | None] | None, got: list[str | None], fresh: list[bool]
) -> bool:
    """Whether the blocks copied in a move hash as they did when they were parked
    (per-block digests; a copy parked before keys is checked whole at its source)."""
    if not isinstance(expected, list):
        return True
    return all(
        e is None or g is None or e == g
        for e, g, new in zip(expected, got, fresh, strict=True)
        if new
    )
