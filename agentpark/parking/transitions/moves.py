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

from agentpark.enums import EventKind, Reason, State
from agentpark.errors import InvalidStateError
from agentpark.parking.handles import copy_checksum, parked_handle
from agentpark.parking.registry import LiveSession
from agentpark.parking.transitions.steps import Steps
from agentpark.tiers.base import HostTier

__all__ = ["Moves", "move_detail"]


def move_detail(direction: str, peer: str, move_id: str) -> str:
    """The detail of a move's event: ``to=URL move=ID`` or ``from=URL move=ID``."""
    return f"{direction}={peer} move={move_id}"


class Moves(Steps):
    def moved_out(self, live: LiveSession, peer: str, move_id: str) -> None:
        """PARKED -> DELETED: the target committed the session; its copy here is dropped
        (LOST: a move in doubt across a restart that lost the copy here).

        Written first (refused: nothing freed, the session stays parked here), then the
        slots go. The caller removes it from the registry.
        """
        row = live.row
        if row.state not in (State.PARKED, State.LOST):
            raise InvalidStateError(f"cannot move out in state {row.state}", state=row.state)
        from_state = row.state
        now = time.time()
        tier = row.tier
        event = self.events.event(
            row,
            EventKind.MOVED_OUT,
            now,
            from_state=from_state,
            to_state=State.DELETED,
            from_tier=tier,
            reason=Reason.EXPLICIT,
            nbytes=row.kv_bytes,
            detail=move_detail("to", peer, move_id),
        )
        row.state, row.tier, row.deleted_at = State.DELETED, None, now
        row.kv_blocks = row.kv_bytes = 0
        row.parked_handle, row.checksum = None, None
        self.commit(live, event)
        self.free_slots(live, tier)

    def moved_in(
        self,
        live: LiveSession,
        tier: HostTier,
        slots: Sequence[int],
        keys: Sequence[Hashable | None],
        digests: Sequence[str | None],
        peer: str,
        move_id: str,
        nbytes: int,
        duration_ms: float,
        revive: bool,
    ) -> None:
        """none (or a row deleted here before, e.g. moved out earlier) -> PARKED in ``tier``.

        Every block is in its slot and verified; the session's row (``live.row``, filled
        with what the source sent) is written with its ``moved_in`` event in one write.
        ``revive``: the row exists (deleted) and is updated, else inserted. Refused by
        the database: StorageUnavailableError, the caller frees the slots. The caller
        adds the session to the registry (which counts it).
        """
        row = live.row
        now = time.time()
        block = self.host.geometry.block_nbytes
        row.state, row.tier, row.tier_since = State.PARKED, tier.name, now
        row.deleted_at, row.lost_reason = None, None
        row.kv_blocks, row.kv_bytes = len(slots), len(slots) * block
        row.parked_handle = parked_handle(slots, keys, digests)
        row.checksum = copy_checksum(digests)
        event = self.events.event(
            row,
            EventKind.MOVED_IN,
            now,
            to_state=State.PARKED,
            to_tier=tier.name,
            reason=Reason.EXPLICIT,
            nbytes=nbytes,
            duration_ms=duration_ms,
            detail=move_detail("from", peer, move_id),
        )
        if revive:  # not live here: the registry counts it once the caller adds it
            self.events.commit(row, event)
        else:
            self.events.insert(row, event)
        live.slots, live.keys, live.digests = list(slots), list(keys), list(digests)
