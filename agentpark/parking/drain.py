"""Drain: before the daemon stops, park every session into a persistent tier (shm, disk).

New work is refused from the first moment. Sessions that cannot be made safe before the
deadline, or find no room, are recorded as LOST so the next start recomputes them.
"""

from __future__ import annotations

import logging
import time

from agentpark.enums import EventKind, Reason, State, TierChoice
from agentpark.errors import AgentparkError, StorageUnavailableError
from agentpark.parking.core import SessionCore
from agentpark.parking.registry import LiveSession
from agentpark.tiers.base import HostTier
from agentpark.tiers.capabilities import Wakeable

__all__ = ["drain"]

log = logging.getLogger(__name__)


def drain(core: SessionCore, deadline_s: float) -> dict[str, int]:
    """Park everything within ``deadline_s``; returns how many ended which way."""
    core.draining = True
    if isinstance(core.host, Wakeable):  # requests waiting for pool blocks give up (503) now
        core.host.wake()
    deadline = time.monotonic() + deadline_s
    persistent = core.mover.candidates(TierChoice.AUTO, persistent_only=True)
    summary = {"parked": 0, "moved": 0, "already_safe": 0, "lost": 0}
    newest_first = sorted(core.registry.all(), key=lambda lv: lv.row.last_active_at, reverse=True)
    for live in newest_first:
        summary[_drain_one(core, live, persistent, deadline)] += 1
    log.info("drain: %s", summary)
    return summary


def _drain_one(
    core: SessionCore, live: LiveSession, persistent: list[HostTier], deadline: float
) -> str:
    if not core.registry.acquire_waiting(live, "drain", deadline - time.monotonic()):
        return _lose(core, live, "drain deadline passed while it was busy", locked=False)
    row = live.row
    try:
        if row.state == State.LOST or (row.state == State.ACTIVE and not live.block_table):
            return "already_safe"
        if row.state == State.PARKED and core.tiers[row.tier or ""].persistent:
            return "already_safe"
        if time.monotonic() > deadline:
            return _lose(core, live, "drain deadline passed")
        if not persistent:
            return _lose(core, live, "no persistent tier to drain into")
        try:
            if row.state == State.PARKED:
                core.move_locked(live, persistent, Reason.DRAIN)
                return "moved"
            dst, slots = core.mover.reserve(live.key, persistent, len(live.block_table))
            row.state = State.PAUSING
            core.park_locked(live, dst, slots, row.tool, None, Reason.DRAIN)
            return "parked"
        except AgentparkError as exc:
            return _lose(core, live, f"drain could not park it: {exc.message}")
    finally:
        core.registry.release(live)


def _lose(core: SessionCore, live: LiveSession, reason: str, locked: bool = True) -> str:
    """Record that this session will need a recompute after the restart."""
    row = live.row
    if row.state == State.LOST:
        return "lost"
    event = core.events.event(
        row,
        EventKind.LOST,
        time.time(),
        from_state=row.state,
        to_state=State.LOST,
        from_tier=row.tier,
        reason=Reason.DRAIN,
        nbytes=row.kv_bytes,
        detail=reason,
    )
    tier = row.tier
    core.mark_lost(live, reason)
    try:
        core.events.commit(row, event)
    except StorageUnavailableError:
        # The next start finds the row as last written and recovers it from that.
        log.error("drain: could not record %s/%s as lost: storage unavailable", *live.key)
        return "lost"
    if locked:
        core.release_blocks(live)
        core.free_slots(live, tier)
    return "lost"
