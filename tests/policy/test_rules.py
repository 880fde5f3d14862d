"""Table tests for every policy rule: pure functions, no server."""

from __future__ import annotations

from typing import Any

import pytest

from agentpark.config import PolicySettings
from agentpark.policy.rules import (
    Demote,
    Drop,
    HostView,
    Park,
    Prefetch,
    SessionView,
    demote_rule,
    idle_rule,
    pause_decision,
    prefetch_rule,
    pressure_rule,
    ttl_rule,
)

CFG = PolicySettings(
    idle_pause_after_s=30,
    min_pause_s=2.0,
    overhead_s=0.0,
    hbm_high_watermark=0.9,
    prefetch_lead_s=0.5,
    demote_after_s={"dram": 300, "shm": 3600},
)
HOST = HostView(
    total_blocks=100, used_blocks=50, block_bytes=1000, bandwidth_bps=1e6,
    tiers=("dram", "shm", "disk"),
)  # fmt: skip


def view(**kw: Any) -> SessionView:
    base: dict[str, Any] = {
        "key": ("t", "s"),
        "state": "active",
        "tier": None,
        "kv_blocks": 10,
        "kv_bytes": 10_000,
        "last_active_at": 1000.0,
        "busy": False,
    }
    return SessionView(**(base | kw))


@pytest.mark.parametrize(
    ("now", "session", "cfg", "expected"),
    [
        (1029.9, view(), CFG, None),  # not idle long enough
        (1030.0, view(), CFG, Park(("t", "s"), "idle")),  # exactly reached
        (2000.0, view(busy=True), CFG, None),  # never one in the middle of an operation
        (2000.0, view(kv_blocks=0), CFG, None),  # nothing in the pool to park
        (2000.0, view(state="parked", tier="dram"), CFG, None),
        (2000.0, view(), CFG.model_copy(update={"idle_pause_after_s": 0}), None),  # disabled
    ],
)
def test_idle_rule(now: float, session: SessionView, cfg: PolicySettings, expected: Any) -> None:
    assert idle_rule(now, session, cfg) == expected


def test_pressure_parks_lru_idle_sessions_until_below_the_watermark() -> None:
    sessions = [
        view(key=("t", "new"), last_active_at=300, kv_blocks=30),
        view(key=("t", "old"), last_active_at=100, kv_blocks=20),
        view(key=("t", "busy"), last_active_at=50, kv_blocks=40, busy=True),
        view(key=("t", "mid"), last_active_at=200, kv_blocks=5),
    ]
    host = HostView(total_blocks=100, used_blocks=95, block_bytes=1, bandwidth_bps=1.0)
    # 95 used, limit 90: the least recently used idle session alone brings it under.
    assert pressure_rule(sessions, host, CFG) == [Park(("t", "old"), "pressure")]
    host = HostView(total_blocks=100, used_blocks=112, block_bytes=1, bandwidth_bps=1.0)
    assert pressure_rule(sessions, host, CFG) == [
        Park(("t", "old"), "pressure"),
        Park(("t", "mid"), "pressure"),
    ]


@pytest.mark.parametrize("used", [50, 90])  # below, and exactly at the watermark: nothing
def test_pressure_does_nothing_at_or_below_the_watermark(used: int) -> None:
    host = HostView(total_blocks=100, used_blocks=used, block_bytes=1, bandwidth_bps=1.0)
    assert pressure_rule([view()], host, CFG) == []


PARKED = view(state="parked", tier="dram", expected_resume_at=2000.0)


@pytest.mark.parametrize(
    ("now", "session", "expected"),
    [
        # restore takes 10_000 B / 1e6 B/s = 10 ms; starts 0.5 s + 10 ms ahead of 2000
        (1999.0, PARKED, None),
        (1999.49, PARKED, Prefetch(("t", "s"))),
        (2500.0, PARKED, Prefetch(("t", "s"))),
        (2500.0, view(state="parked", tier="dram", expected_resume_at=None), None),
        (2500.0, view(state="parked", tier="dram", expected_resume_at=2000.0, busy=True), None),
        (2500.0, view(state="active", expected_resume_at=2000.0), None),
    ],
)  # fmt: skip
def test_prefetch_rule(now: float, session: SessionView, expected: Any) -> None:
    assert prefetch_rule(now, session, HOST, CFG) == expected


def test_prefetch_waits_when_the_pool_has_no_room_below_the_watermark() -> None:
    full = HostView(total_blocks=100, used_blocks=85, block_bytes=1000, bandwidth_bps=1e6)
    s = view(state="parked", tier="dram", expected_resume_at=1.0, kv_blocks=10)
    assert prefetch_rule(10.0, s, full, CFG) is None


@pytest.mark.parametrize(
    ("now", "session", "tiers", "expected"),
    [
        (1299.0, view(state="parked", tier="dram", tier_since=1000.0), ("dram", "shm"), None),
        (1300.0, view(state="parked", tier="dram", tier_since=1000.0), ("dram", "shm"),
         Demote(("t", "s"), "shm")),
        (1300.0, view(state="parked", tier="dram", tier_since=1000.0), ("dram", "disk"),
         Demote(("t", "s"), "disk")),  # shm not enabled: the next enabled tier
        (1300.0, view(state="parked", tier="dram", tier_since=1000.0), ("dram",), None),
        (9000.0, view(state="parked", tier="disk", tier_since=1000.0), ("dram", "shm", "disk"),
         None),  # disk is the last tier
        (4600.0, view(state="parked", tier="shm", tier_since=1000.0), ("dram", "shm", "disk"),
         Demote(("t", "s"), "disk")),
        (9000.0, view(state="parked", tier="dram", tier_since=None), ("dram", "shm"), None),
    ],
)  # fmt: skip
def test_demote_rule(
    now: float, session: SessionView, tiers: tuple[str, ...], expected: Any
) -> None:
    host = HostView(total_blocks=100, used_blocks=0, block_bytes=1, bandwidth_bps=1, tiers=tiers)
    assert demote_rule(now, session, host, CFG) == expected


@pytest.mark.parametrize(
    ("expected_s", "kv_bytes", "used", "park", "why_has"),
    [
        (None, 10_000, 50, True, "no expected pause duration (test)"),  # missing estimate
        (0.0, 10_000, 50, False, "shorter than the break-even 2s"),  # zero: keep
        (1.99, 10_000, 50, False, "break-even 2s"),  # under min_pause_s
        (2.0, 10_000, 50, True, "outlasts"),  # exactly the threshold: park
        # 3 MB at 1 MB/s is a 6 s round trip: above min_pause_s, so it is the threshold
        (5.0, 3_000_000, 50, False, "round trip 6e+03 ms"),
        (7.0, 3_000_000, 50, True, "outlasts the break-even 6s"),
        (0.1, 10_000, 91, True, "above hbm_high_watermark"),  # pressure wins
    ],
)
def test_break_even_pause_decision(
    expected_s: float | None, kv_bytes: int, used: int, park: bool, why_has: str
) -> None:
    host = HostView(total_blocks=100, used_blocks=used, block_bytes=1000, bandwidth_bps=1e6)
    decision = pause_decision(expected_s, "test", kv_bytes, host, CFG)
    assert decision.park is park
    assert why_has in decision.why


TTL = CFG.model_copy(update={"parked_ttl_s": 600.0})
OFF = CFG.model_copy(update={"parked_ttl_s": 0.0})


@pytest.mark.parametrize(
    ("now", "session", "cfg", "expected"),
    [
        (1600.0, view(state="parked", tier="shm"), TTL, Drop(("t", "s"))),  # exactly the ttl
        (1599.0, view(state="parked", tier="disk"), TTL, None),  # not yet
        (9e9, view(state="parked", tier="dram"), OFF, None),  # 0: off
        (9e9, view(state="parked", tier="shm", busy=True), TTL, None),  # an operation has it
        (9e9, view(state="active"), TTL, None),  # KV in the engine: not the ttl's
        (9e9, view(state="lost", kv_blocks=0), TTL, None),  # nothing left to drop
        # a demotion moved it late: the age is still from its last activity
        (1700.0, view(state="parked", tier="disk", tier_since=1650.0), TTL, Drop(("t", "s"))),
    ],
)  # fmt: skip
def test_ttl_rule(now: float, session: SessionView, cfg: PolicySettings, expected: Any) -> None:
    assert ttl_rule(now, session, cfg) == expected
