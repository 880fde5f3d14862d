"""Parks: ACTIVE -> PAUSING -> PARKED (or back to ACTIVE), and a pause kept in the pool."""

from __future__ import annotations

import time
from collections.abc import Sequence

from agentpark.enums import EventKind, Reason, State
from agentpark.errors import InvalidStateError, StorageUnavailableError
from agentpark.parking.handles import copy_checksum, parked_handle
from agentpark.parking.mover import Endpoint
from agentpark.parking.registry import LiveSession
from agentpark.parking.transitions.steps import Steps
from agentpark.parking.types import as_transfer_error
from agentpark.store.models import EventRow
from agentpark.tiers.base import HostTier

__all__ = ["Parks"]


class Parks(Steps):
    def begin_park(
        self, live: LiveSession, candidates: Sequence[HostTier]
    ) -> tuple[HostTier, list[int]]:
        """ACTIVE -> PAUSING: a slot for every block in the first candidate with room for
        those it lacks (``live.pending`` says which are new: only those are copied).

        TierFullError (507) naming every tier tried, with nothing changed.
        """
        row = live.row
        if row.state != State.ACTIVE:
            raise InvalidStateError(f"cannot pause in state {row.state}", state=row.state)
        keys = self.block_keys(live, len(live.block_table))
        dst, live.pending = self.mover.reserve(live.key, candidates, keys)
        row.state = State.PAUSING
        self.tally.update(row)
        return dst, live.pending.slots

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
        live.slots, live.pending = [], None
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
        """PAUSING -> PARKED: copy the blocks ``dst`` lacks from ``source`` into their
        slots, then commit. On a failed copy the park is aborted (ACTIVE, blocks
        untouched) and it raises. Returns the milliseconds.
        """
        started = time.perf_counter()
        assert live.pending is not None and live.pending.slots == slots
        try:
            digests = self.mover.fill(source, list(live.block_table), dst, live.pending)
        except Exception as exc:
            self.abort_park(live, dst, exc)
            raise as_transfer_error("pause", exc) from exc
        return self.finish_park(live, dst, digests, started, tool, expected_resume_s, reason)

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
        digests: dict[int, str | None],
        started: float,
        tool: str | None,
        expected_resume_s: float | None,
        reason: str,
        prior: Sequence[EventRow] = (),
    ) -> float:
        """PAUSING -> PARKED: every new block is in its slot of ``dst`` (``digests``: of
        those copied, by slot), the shared ones were there already.

        The pool's blocks are let go only once the commit is in; a refused commit frees
        the slots and leaves the session ACTIVE with its blocks (and raises). The new
        blocks are shared (sealed) only after the commit. ``prior``: events not yet
        committed that go first in the same write (an external engine's turn). Returns
        the milliseconds since ``started``.
        """
        row, res = live.row, live.pending
        assert res is not None
        num_blocks = len(live.block_table)
        now = time.time()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        block = self.host.geometry.block_nbytes
        copied = len(digests) * block
        per_block = [
            digests.get(slot) if new else dst.digest_of(slot)
            for slot, new in zip(res.slots, res.fresh, strict=True)
        ]
        event = self.events.event(
            row,
            EventKind.PAUSE,
            now,
            from_state=State.ACTIVE,
            to_state=State.PARKED,
            to_tier=dst.name,
            reason=reason,
            nbytes=copied,
            duration_ms=elapsed_ms,
            detail=_pause_detail(tool, num_blocks, len(digests)),
        )
        live.slots = res.slots
        row.state, row.tier, row.tier_since = State.PARKED, dst.name, now
        row.pause_count += 1
        if reason in (Reason.EXPLICIT, Reason.TURN_END) or row.tool is None:
            # A new wait starts here; a policy pause of a session already waiting on its
            # tool (kept at first, parked later) keeps the wait's start and estimate.
            row.paused_at, row.tool = now, tool
            row.expected_resume_at = None if expected_resume_s is None else now + expected_resume_s
        row.parked_handle = parked_handle(res.slots, res.keys, per_block)
        row.checksum = copy_checksum(per_block)
        row.kv_blocks, row.kv_bytes = num_blocks, num_blocks * block
        try:
            self.commit(live, *prior, event)
        except StorageUnavailableError:  # the row is ACTIVE again; so is the rest
            dst.free(live.key)
            live.slots, live.pending = [], None
            raise
        dst.seal(live.key, digests)
        live.keys, live.digests, live.pending = list(res.keys), per_block, None
        self.mover.measured(copied, elapsed_ms)
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


def _pause_detail(tool: str | None, num_blocks: int, copied: int) -> str | None:
    """A pause's detail: its tool, and how many of its blocks the tier held already."""
    parts = [f"tool={tool}"] if tool else []
    if copied < num_blocks:
        parts.append(f"shared={num_blocks - copied}")
    return " ".join(parts) or None
