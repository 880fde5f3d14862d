"""What the session core and the policy share about a session: a read-only view of it.

On the floor of :mod:`agentpark.enums`, below both: the parking package's pressure relief
and the policy rules choose sessions with the same function without either importing the
other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentpark.enums import State

if TYPE_CHECKING:
    from agentpark.store.models import SessionRow

__all__ = ["SessionView", "idle_candidate", "least_recently_used"]


@dataclass(frozen=True)
class SessionView:
    """What the rules may know about one session."""

    key: tuple[str, str]
    state: str
    tier: str | None
    kv_blocks: int
    kv_bytes: int
    last_active_at: float
    busy: bool  # an operation (generate, pause, ...) holds it right now
    tier_since: float | None = None
    expected_resume_at: float | None = None

    @classmethod
    def of(cls, row: SessionRow, busy: bool, kv_blocks: int | None = None) -> SessionView:
        """A session row as the rules see it; ``kv_blocks`` where the caller knows better
        than the row (the block table of a session the engine is growing)."""
        return cls(
            key=(row.tenant, row.session_id),
            state=row.state,
            tier=row.tier,
            kv_blocks=row.kv_blocks if kv_blocks is None else kv_blocks,
            kv_bytes=row.kv_bytes,
            last_active_at=row.last_active_at,
            busy=busy,
            tier_since=row.tier_since,
            expected_resume_at=row.expected_resume_at,
        )


def idle_candidate(s: SessionView) -> bool:
    """Active, holding pool blocks, and no operation holds it: it may be parked."""
    return s.state == State.ACTIVE and s.kv_blocks > 0 and not s.busy


def least_recently_used(sessions: Sequence[SessionView], blocks: int) -> list[SessionView]:
    """Idle sessions, least recently used first, until their blocks add up to ``blocks``.

    All idle sessions when even all of them hold fewer. The pressure rule and the room
    a generate makes for itself both choose with this.
    """
    chosen: list[SessionView] = []
    freed = 0
    for s in sorted(filter(idle_candidate, sessions), key=lambda v: v.last_active_at):
        if freed >= blocks:
            break
        chosen.append(s)
        freed += s.kv_blocks
    return chosen
