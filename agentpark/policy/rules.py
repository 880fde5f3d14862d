"""Policy rules: pure functions of (now, session, host, config) -> action.

No I/O, no clock, no locks: the loop (agentpark.policy.service) takes a snapshot, asks these,
and carries the actions out through parking. That keeps every rule table-testable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from agentpark.config import PolicySettings
from agentpark.enums import PARKING_TIERS, State
from agentpark.views import SessionView, idle_candidate, least_recently_used

__all__ = [
    "Demote",
    "Drop",
    "HostView",
    "Park",
    "PauseDecision",
    "Prefetch",
    "SessionView",
    "demote_rule",
    "idle_rule",
    "least_recently_used",
    "pause_decision",
    "prefetch_rule",
    "pressure_rule",
    "ttl_rule",
]

TIER_ORDER: tuple[str, ...] = tuple(PARKING_TIERS)


@dataclass(frozen=True)
class HostView:
    total_blocks: int
    used_blocks: int
    block_bytes: int
    bandwidth_bps: float  # measured pause/restore bytes per second on this host
    tiers: tuple[str, ...] = ()  # enabled tiers, in auto order


@dataclass(frozen=True)
class Park:
    key: tuple[str, str]
    reason: str  # idle | pressure


@dataclass(frozen=True)
class Prefetch:
    key: tuple[str, str]


@dataclass(frozen=True)
class Demote:
    key: tuple[str, str]
    to_tier: str


@dataclass(frozen=True)
class Drop:
    """Free a parked copy nobody came back for (``policy.parked_ttl_s``): the session is
    lost and its next turn recomputes from its tokens."""

    key: tuple[str, str]


@dataclass(frozen=True)
class PauseDecision:
    park: bool
    why: str


def idle_rule(now: float, s: SessionView, cfg: PolicySettings) -> Park | None:
    """Park a session no generate or resume has touched for idle_pause_after_s."""
    if cfg.idle_pause_after_s <= 0 or not idle_candidate(s):
        return None
    if now - s.last_active_at >= cfg.idle_pause_after_s:
        return Park(s.key, "idle")
    return None


def pressure_rule(
    sessions: Sequence[SessionView], host: HostView, cfg: PolicySettings
) -> list[Park]:
    """Above the watermark, park idle sessions least recently used first until below it."""
    excess = host.used_blocks - cfg.hbm_high_watermark * host.total_blocks
    if excess <= 0:
        return []
    return [Park(s.key, "pressure") for s in least_recently_used(sessions, math.ceil(excess))]


def restore_seconds(kv_bytes: int, host: HostView, cfg: PolicySettings) -> float:
    """What bringing ``kv_bytes`` back costs on this host (one direction)."""
    return kv_bytes / max(host.bandwidth_bps, 1.0) + cfg.overhead_s / 2


def prefetch_rule(
    now: float, s: SessionView, host: HostView, cfg: PolicySettings
) -> Prefetch | None:
    """Restore a parked session ahead of its expected resume, if the pool has room."""
    if s.state != State.PARKED or s.busy or s.expected_resume_at is None:
        return None
    start_at = s.expected_resume_at - cfg.prefetch_lead_s - restore_seconds(s.kv_bytes, host, cfg)
    if now < start_at:
        return None
    room = cfg.hbm_high_watermark * host.total_blocks - host.used_blocks
    return Prefetch(s.key) if s.kv_blocks <= room else None


def demote_rule(now: float, s: SessionView, host: HostView, cfg: PolicySettings) -> Demote | None:
    """Move a parked session to the next enabled tier once it has sat long enough."""
    if s.state != State.PARKED or s.busy or s.tier is None or s.tier_since is None:
        return None
    after = cfg.demote_after_s.get(s.tier)  # type: ignore[call-overload]
    if after is None or now - s.tier_since < after:
        return None
    if s.tier not in TIER_ORDER:
        return None
    lower = [t for t in TIER_ORDER[TIER_ORDER.index(s.tier) + 1 :] if t in host.tiers]
    return Demote(s.key, lower[0]) if lower else None


def ttl_rule(now: float, s: SessionView, cfg: PolicySettings) -> Drop | None:
    """Drop a parked copy whose session has been untouched for ``parked_ttl_s``.

    The age is from the session's last activity (its last turn, generate or restore), not
    from its last move between tiers: a demotion does not make a copy younger.
    """
    if cfg.parked_ttl_s <= 0 or s.state != State.PARKED or s.busy:
        return None
    return Drop(s.key) if now - s.last_active_at >= cfg.parked_ttl_s else None


def pause_decision(
    expected_s: float | None,
    expected_source: str,
    kv_bytes: int,
    host: HostView,
    cfg: PolicySettings,
) -> PauseDecision:
    """Break-even: park only when the pause outlasts what the round trip would cost.

    The round trip is the copy out and back at the measured bandwidth, plus overhead;
    ``min_pause_s`` is a floor an operator sets for costs this model does not see. Above
    the watermark the pool needs the room, so the session is parked whatever the estimate.
    """
    if host.total_blocks and host.used_blocks > cfg.hbm_high_watermark * host.total_blocks:
        return PauseDecision(True, "pool is above hbm_high_watermark: it needs the room")
    if expected_s is None:
        return PauseDecision(
            True, f"no expected pause duration ({expected_source}): parking frees the pool"
        )
    round_trip = 2 * restore_seconds(kv_bytes, host, cfg)
    threshold = max(cfg.min_pause_s, round_trip)
    if expected_s < threshold:
        return PauseDecision(
            False,
            f"expected pause {expected_s:.3g}s ({expected_source}) is shorter than the "
            f"break-even {threshold:.3g}s (round trip {round_trip * 1e3:.3g} ms, "
            f"min_pause_s {cfg.min_pause_s:g}s)",
        )
    return PauseDecision(
        True,
        f"expected pause {expected_s:.3g}s ({expected_source}) outlasts the break-even "
        f"{threshold:.3g}s",
    )
