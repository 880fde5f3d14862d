"""The reference engine's sessions in the store by content: shared once, copied once.

Two sessions whose token logs share whole blocks share those blocks' slots (the same
tenant only), a session's next pause copies only the blocks the tier lacks, a restart
rebuilds the sharing from SQLite, and a damaged shared block is caught by whoever reads
it. All bit-exact against the same sessions never parked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
from sqlalchemy import select

from agentpark import integrity
from agentpark.config import Settings
from agentpark.enums import State
from agentpark.parking import PauseOrder
from agentpark.runtime import Runtime
from agentpark.store.db import open_database
from agentpark.store.models import SessionRow

BLOCK = 16
PROMPT = [(i * 37) % 250 + 1 for i in range(3 * BLOCK + 5)]  # 3 whole blocks and a part


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(
        pool={"num_blocks": 64},
        tiers={"dram": {"capacity": 0}, "shm": {"capacity": 32 * 4096}},
        limits={"admission_timeout_s": 0},
        policy={"enabled": False},
    )


@pytest.fixture
def runtime(settings: Settings) -> Iterator[Runtime]:
    runtime = Runtime.start(settings)
    yield runtime
    runtime.shutdown()


def _pause(runtime: Runtime, tenant: str, sid: str) -> None:
    result = runtime.parking.pause(tenant, sid, PauseOrder(tier="shm", force=True))
    assert result.row.state == State.PARKED, result


def _new(runtime: Runtime, tenant: str, sid: str) -> list[int]:
    runtime.parking.create(tenant, sid, None)
    return runtime.driver.generate(tenant, sid, PROMPT, 4).tokens


def _pause_event(runtime: Runtime, tenant: str, sid: str) -> tuple[int, str | None]:
    event = next(e for e in runtime.parking.list_events(tenant, sid, 50) if e.kind == "pause")
    return event.bytes or 0, event.detail


def test_two_sessions_with_the_same_prefix_hold_it_once(runtime: Runtime) -> None:
    shm = runtime.parking.tiers["shm"]
    block = shm.geometry.block_nbytes
    out_a, out_b = _new(runtime, "t", "a"), _new(runtime, "t", "b")
    assert out_a == out_b
    _pause(runtime, "t", "a")
    _pause(runtime, "t", "b")
    whole = (len(PROMPT) + 4) // BLOCK  # whole blocks of the log: keyed, shared
    blocks = runtime.parking.get("t", "b").kv_blocks
    assert shm.used_blocks == whole + 2 * (blocks - whole)  # one prefix, two partial tails
    nbytes, detail = _pause_event(runtime, "t", "b")
    assert nbytes == (blocks - whole) * block and detail == f"shared={whole}"
    runtime.parking.delete("t", "a")
    assert shm.used_blocks == blocks  # b's copy, whole
    # b restores bit-exact from the blocks a parked: it continues as a never-parked session.
    runtime.parking.create("t", "ref", None)
    runtime.driver.generate("t", "ref", PROMPT, 4)
    assert runtime.driver.generate("t", "b", [7], 6).tokens == (
        runtime.driver.generate("t", "ref", [7], 6).tokens
    )
    runtime.driver.check_invariants()


def test_another_tenant_never_shares_a_block(runtime: Runtime) -> None:
    shm = runtime.parking.tiers["shm"]
    _new(runtime, "t", "a")
    _new(runtime, "u", "a")
    _pause(runtime, "t", "a")
    _pause(runtime, "u", "a")
    blocks = runtime.parking.get("t", "a").kv_blocks
    assert shm.used_blocks == 2 * blocks
    assert _pause_event(runtime, "u", "a")[1] is None  # nothing shared


def test_a_later_pause_copies_only_the_new_blocks(runtime: Runtime) -> None:
    _new(runtime, "t", "a")
    _pause(runtime, "t", "a")
    runtime.driver.generate("t", "a", list(range(1, 2 * BLOCK + 1)), 2)  # restored, grown
    _pause(runtime, "t", "a")
    row = runtime.parking.get("t", "a")
    events = [e for e in runtime.parking.list_events("t", "a", 50) if e.kind == "pause"]
    first_whole = (len(PROMPT) + 4) // BLOCK
    block = runtime.parking.tiers["shm"].geometry.block_nbytes
    assert events[0].bytes == (row.kv_blocks - first_whole) * block  # newest first
    assert events[0].detail == f"shared={first_whole}"


def test_a_restart_rebuilds_the_sharing_and_both_restore(settings: Settings) -> None:
    runtime = Runtime.start(settings)
    try:
        _new(runtime, "t", "a")
        _new(runtime, "t", "b")
        _pause(runtime, "t", "a")
        _pause(runtime, "t", "b")
        used = runtime.parking.tiers["shm"].used_blocks
    finally:
        runtime.shutdown()
    runtime = Runtime.start(settings)
    try:
        shm = runtime.parking.tiers["shm"]
        assert shm.used_blocks == used
        for sid in ("a", "b"):
            assert runtime.parking.get("t", sid).state == State.PARKED
        outs = [runtime.driver.generate("t", sid, [9], 5).tokens for sid in ("a", "b")]
        assert outs[0] == outs[1]
        runtime.driver.check_invariants()
    finally:
        runtime.shutdown()


def test_a_damaged_shared_block_fails_every_reader_and_is_never_shared_again(
    runtime: Runtime,
) -> None:
    _new(runtime, "t", "a")
    _new(runtime, "t", "b")
    _pause(runtime, "t", "a")
    _pause(runtime, "t", "b")
    shm = runtime.parking.tiers["shm"]
    live_a = runtime.parking.registry.find(("t", "a"))
    assert live_a is not None
    shared, keys = live_a.slots[0], [k for k in live_a.keys if k is not None]
    assert shm.find(keys[:1]) == [shared]
    shm.buffers()[0][shared].view(np.uint8).flat[3] ^= 1
    for sid in ("a", "b"):
        runtime.parking.resume("t", sid)
        kinds = [e.kind for e in runtime.parking.list_events("t", sid, 50)]
        assert "corrupt" in kinds and "recompute" in kinds  # caught, rebuilt from the log
    assert shm.find(keys) == []


def test_a_copy_parked_before_keys_restores_after_the_upgrade(settings: Settings) -> None:
    """A database and shm file from before blocks had keys: the handle lists slots only and
    one checksum covers the copy (xxh3p). It re-attaches, verifies and restores as before,
    and is never shared (its blocks have no key)."""
    runtime = Runtime.start(settings)
    try:
        _new(runtime, "t", "old")
        _pause(runtime, "t", "old")
        live = runtime.parking.registry.find(("t", "old"))
        assert live is not None
        shm = runtime.parking.tiers["shm"]
        legacy = integrity.checksum(shm, live.slots)  # the old definition, whole copy
        slots = list(live.slots)
    finally:
        runtime.shutdown()
    engine, _sessions = open_database(settings.database_url)
    with engine.begin() as conn:
        conn.execute(
            SessionRow.__table__.update()  # type: ignore[attr-defined]
            .where(SessionRow.session_id == "old")
            .values(parked_handle={"slots": slots}, checksum=legacy)
        )
        row = conn.execute(select(SessionRow.parked_handle).where(SessionRow.session_id == "old"))
        assert row.scalar_one() == {"slots": slots}
    engine.dispose()
    runtime = Runtime.start(settings)
    try:
        assert runtime.parking.get("t", "old").state == State.PARKED
        shm = runtime.parking.tiers["shm"]
        assert shm.used_blocks == len(slots) and shm.find([("t", b"x" * 32)]) == []
        runtime.parking.create("t", "ref", None)
        runtime.driver.generate("t", "ref", PROMPT, 4)
        assert runtime.driver.generate("t", "old", [3], 6).tokens == (
            runtime.driver.generate("t", "ref", [3], 6).tokens
        )
        kinds = [e.kind for e in runtime.parking.list_events("t", "old", 50)]
        assert "resume" in kinds and "corrupt" not in kinds
    finally:
        runtime.shutdown()
