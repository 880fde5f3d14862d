"""The policy loop in vLLM mode, through the real control socket, shm pool and disk file.

Demotion of a pool copy to the disk tier after ``policy.demote_after_s.shm``, its
promotion back into the pool when the session's next turn asks ``match`` (the bytes the
worker then reads from the pool are those it parked), and the TTL that drops a parked
copy nobody came back for. The loop is driven by calling ``tick`` with a clock value;
nothing waits on time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from agentpark.config import Settings
from agentpark.connectors.client import ControlClient
from agentpark.control.vllm import VllmService
from agentpark.enums import Reason, State, Tier
from agentpark.metrics import Metrics
from agentpark.parking import CoreOptions
from agentpark.policy.rules import Demote, Drop
from agentpark.policy.service import PolicyService
from agentpark.store.db import open_database
from agentpark.store.migrate import upgrade
from agentpark.store.repository import SessionStore
from agentpark.tiers.filetier import FileTier
from tests.connectors.conftest import TENANT
from tests.control.test_control import BLOCK, Daemon, _park, _register
from tests.harness import tiny_settings

DEMOTE_S = 60.0
TTL_S = 600.0


@dataclass
class PolicyDaemon(Daemon):
    policy: PolicyService
    metrics: Metrics


def _start(settings: Settings, store: SessionStore) -> tuple[VllmService, PolicyService, Metrics]:
    service = VllmService(settings, store, CoreOptions(checksum_tiers=frozenset({"shm", "disk"})))
    core = service.driver.core
    policy = PolicyService(core, store, settings.policy)  # as the daemon builds it
    metrics = Metrics(lambda: core.snapshot(ready=True, listen="test"), core.live_sessions, "h")
    core.add_listener(metrics.observe)
    service.start()
    return service, policy, metrics


def _close(service: VllmService) -> None:
    service.stop()
    service.driver.core.close()
    for tier in service.driver.core.tiers.values():
        tier.close()


@pytest.fixture
def daemon(tmp_path: Path, shm_dir: Path) -> Iterator[PolicyDaemon]:
    settings = tiny_settings(
        tmp_path / "state",
        shm_dir,
        vllm={"enabled": True, "pool_capacity": 1 << 20, "pool_path": shm_dir / "pool"},
        tiers={"disk": {"capacity": 1 << 20, "path": tmp_path / "disk.bin"}},
        policy={"demote_after_s": {"shm": DEMOTE_S}, "parked_ttl_s": TTL_S},
    )
    upgrade(settings.database_url)
    store = SessionStore(*open_database(settings.database_url))
    service, policy, metrics = _start(settings, store)
    client = ControlClient(None, socket_path=str(service.socket_path))
    made = PolicyDaemon(settings, store, service, client, policy, metrics)
    yield made
    made.client.close()
    _close(made.service)
    store.close()


def _tier(daemon: Daemon, name: str) -> FileTier:
    tier = daemon.service.driver.core.tiers[name]
    assert isinstance(tier, FileTier)
    return tier


def _file_rows(tier: FileTier, slots: list[int]) -> list[np.ndarray]:
    """The slots' bytes as they are in the tier's file (mapped anew, not the tier's map)."""
    rows = []
    for spec, offset in zip(tier.geometry.arrays, tier.region_offsets, strict=True):
        mapped = np.memmap(
            tier.path,
            dtype=spec.dtype,
            mode="r",
            offset=offset,
            shape=(tier.capacity_blocks, *spec.block_shape),
        )
        rows.append(np.array(mapped[slots]))
    return rows


def _demoted(daemon: PolicyDaemon, session_id: str, parked_at: float) -> list[int]:
    done = daemon.policy.tick(parked_at + DEMOTE_S + 1)
    assert Demote((TENANT, session_id), Tier.DISK) in done
    row = daemon.service.driver.core.get(TENANT, session_id)
    assert row.state == State.PARKED and row.tier == Tier.DISK
    live = daemon.service.driver.core.registry.find((TENANT, session_id))
    assert live is not None
    return list(live.slots)


def test_only_the_rules_on_parked_copies_run_in_vllm_mode(daemon: PolicyDaemon) -> None:
    _register(daemon)
    assert daemon.policy.engine_rules is False  # the daemon cannot reach vLLM's blocks
    kept = daemon.call(
        "prepare_store",
        list(range(2 * BLOCK)),
        tenant=TENANT,
        session_id="kept",
        block_ids=[1, 2],
        expected_resume_s=0.1,
    )
    assert kept["decision"] == "kept"
    core = daemon.service.driver.core
    core.host.engine_blocks = 2  # vLLM's pool "full" of this session: pressure, were it on
    far = time.time() + 1e6  # idle for ages, past every prefetch time
    assert daemon.policy.plan(far) == []
    assert core.get(TENANT, "kept").state == State.ACTIVE


def test_a_pool_copy_is_demoted_to_disk_and_promoted_back_bit_exact_on_the_next_turn(
    daemon: PolicyDaemon,
) -> None:
    _, worker = _register(daemon)
    tokens = list(range(1, 1 + 3 * BLOCK))
    started = time.time()
    _, rows = _park(daemon, worker, "a", tokens, seed=1)
    parked_digests = (daemon.service.driver.core.get(TENANT, "a").parked_handle or {})["digests"]
    pool, disk = _tier(daemon, "shm"), _tier(daemon, "disk")

    assert daemon.policy.tick(started + DEMOTE_S / 2) == []  # not old enough yet
    assert daemon.service.driver.core.get(TENANT, "a").tier == Tier.SHM
    disk_slots = _demoted(daemon, "a", started)
    assert pool.used_blocks == 0 and disk.used_blocks == 3
    for on_disk, parked in zip(_file_rows(disk, disk_slots), rows, strict=True):
        assert np.array_equal(on_disk, parked)  # the copy is in the disk file itself

    # The pool slots the copy left are reused and every other slot is junk: a load that
    # read the pool without a promotion would not find the parked bytes.
    other, _ = _park(daemon, worker, "b", list(range(500, 500 + 2 * BLOCK)), seed=2)
    junk = [s for s in range(pool.capacity_blocks) if s not in other["slots"]]
    worker.write(junk, seed=3)

    turn2 = [*tokens, 4, 5]
    match = daemon.call("match", turn2, tenant=TENANT, session_id="a", num_computed=0)
    assert match["tokens"] == 3 * BLOCK
    row = daemon.service.driver.core.get(TENANT, "a")
    assert row.state == State.PARKED and row.tier == Tier.SHM  # promoted before the answer
    assert disk.used_blocks == 0 and pool.used_blocks == 2 + 3

    load = daemon.call(
        "begin_load", turn2, tenant=TENANT, session_id="a", start_block=0, block_ids=[7, 8, 9]
    )
    assert load["ok"] and load["tier"] == "shm", load
    assert not set(load["slots"]) & set(other["slots"])
    for arr, parked in zip(worker.arrays, rows, strict=True):
        assert np.array_equal(arr[load["slots"]], parked)  # bit for bit what was parked
    assert worker.digests(load["slots"]) == load["digests"] == parked_digests
    done = daemon.call("load_done", load_id=load["load_id"], ok=True)
    assert done["restored_tokens"] == 3 * BLOCK and done["restored_from"] == "shm"
    moves = [
        (e.from_tier, e.to_tier, e.reason)
        for e in reversed(daemon.store.events(TENANT, "a", 100))
        if e.kind == "move"
    ]
    assert moves == [("shm", "disk", Reason.DEMOTE), ("disk", "shm", Reason.EXPLICIT)]
    daemon.service.driver.core.check_invariants()


def test_a_disk_copy_that_cannot_be_promoted_is_not_offered_and_not_loaded(
    daemon: PolicyDaemon,
) -> None:
    _, worker = _register(daemon)
    tokens = list(range(7, 7 + 2 * BLOCK))
    started = time.time()
    _park(daemon, worker, "a", tokens)
    _demoted(daemon, "a", started)
    capacity = _tier(daemon, "shm").capacity_blocks
    big = list(range(capacity * BLOCK))
    _park(daemon, worker, "big", big)  # the pool is full now
    turn2 = [*tokens, 1]
    assert daemon.call("match", turn2, tenant=TENANT, session_id="a", num_computed=0)["tokens"] == 0
    assert daemon.service.driver.core.get(TENANT, "a").tier == Tier.DISK  # still there
    load = daemon.call(
        "begin_load", turn2, tenant=TENANT, session_id="a", start_block=0, block_ids=[1, 2]
    )
    assert load["ok"] is False and "disk" in load["error"]  # the worker reads the pool only
    assert daemon.service.driver.core.get(TENANT, "a").state == State.PARKED


def test_a_parked_copy_past_its_ttl_is_dropped_counted_and_the_next_turn_recomputes(
    daemon: PolicyDaemon,
) -> None:
    _, worker = _register(daemon)
    tokens = list(range(3, 3 + 2 * BLOCK))
    started = time.time()
    _park(daemon, worker, "pool", tokens)
    _park(daemon, worker, "ondisk", list(range(40, 40 + 2 * BLOCK)))
    core = daemon.service.driver.core
    demoted = daemon.policy.tick(started + DEMOTE_S + 1)
    assert {type(a) for a in demoted} == {Demote} and len(demoted) == 2
    assert daemon.policy.tick(started + TTL_S / 2) == []  # on disk, not expired yet
    # One copy back in the pool (the match promotes it), one on disk: both expire.
    assert (
        daemon.call("match", [*tokens, 1], tenant=TENANT, session_id="pool", num_computed=0)[
            "tokens"
        ]
        == 2 * BLOCK
    )
    assert core.get(TENANT, "pool").tier == Tier.SHM

    done = daemon.policy.tick(started + TTL_S + 1)
    assert set(done) == {Drop((TENANT, "pool")), Drop((TENANT, "ondisk"))}
    for session_id in ("pool", "ondisk"):
        row = core.get(TENANT, session_id)
        assert row.state == State.LOST and "parked_ttl_s" in (row.lost_reason or "")
        lost = daemon.store.events(TENANT, session_id, 1)[0]
        assert (lost.kind, lost.reason, lost.to_state) == ("lost", Reason.TTL, State.LOST)
    assert _tier(daemon, "shm").used_blocks == 0 and _tier(daemon, "disk").used_blocks == 0
    body, _ = daemon.metrics.render(None)
    assert 'agentpark_sessions_lost_total{host="h",reason="ttl"} 2.0' in body.decode()

    turn2 = [*tokens, 9]
    assert (
        daemon.call("match", turn2, tenant=TENANT, session_id="pool", num_computed=0)["tokens"] == 0
    )  # nothing to load: vLLM computes the prompt
    again, _ = _park(daemon, worker, "pool", list(range(3, 3 + 3 * BLOCK)))
    assert again["decision"] == "parked"
    kinds = daemon.kinds("pool")
    assert "lost" in kinds and kinds[-2:] == ["turn", "pause"]
    # The new copy is young; the lost session on disk is not dropped twice.
    assert daemon.policy.tick(time.time()) == []
    core.check_invariants()


def test_parked_copies_expire_after_an_hour_by_default(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    assert settings.policy.parked_ttl_s == 3600.0 and settings.policy.enabled


def test_a_copy_on_disk_survives_a_daemon_restart_and_is_promoted_after_it(
    daemon: PolicyDaemon,
) -> None:
    _, worker = _register(daemon)
    tokens = list(range(11, 11 + 2 * BLOCK))
    started = time.time()
    _, rows = _park(daemon, worker, "a", tokens, seed=4)
    _demoted(daemon, "a", started)
    daemon.client.close()
    _close(daemon.service)
    daemon.service, daemon.policy, daemon.metrics = _start(daemon.settings, daemon.store)
    daemon.client = ControlClient(None, socket_path=str(daemon.service.socket_path), timeout_s=10)
    row = daemon.service.driver.core.get(TENANT, "a")
    assert row.state == State.PARKED and row.tier == Tier.DISK  # the disk file re-attached
    _, worker = _register(daemon)
    turn2 = [*tokens, 1]
    assert (
        daemon.call("match", turn2, tenant=TENANT, session_id="a", num_computed=0)["tokens"]
        == 2 * BLOCK
    )
    load = daemon.call(
        "begin_load", turn2, tenant=TENANT, session_id="a", start_block=0, block_ids=[1, 2]
    )
    assert load["ok"], load
    for arr, parked in zip(worker.arrays, rows, strict=True):
        assert np.array_equal(arr[load["slots"]], parked)
    assert worker.digests(load["slots"]) == load["digests"]


def test_another_layout_moves_the_disk_file_aside_and_its_sessions_are_lost(
    daemon: PolicyDaemon,
) -> None:
    from agentpark.connectors.protocol import Layout
    from tests.control.test_control import LAYOUT

    _, worker = _register(daemon)
    started = time.time()
    _park(daemon, worker, "a", list(range(2 * BLOCK)))
    _demoted(daemon, "a", started)
    disk_path = _tier(daemon, "disk").path
    other = Layout(LAYOUT.model_uid + "-other", BLOCK, 64, LAYOUT.arrays, LAYOUT.kv_dtype)
    _register(daemon, other)
    row = daemon.service.driver.core.get(TENANT, "a")
    assert row.state == State.LOST and "layout changed" in (row.lost_reason or "")
    assert list(disk_path.parent.glob(disk_path.name + ".mismatch-*")), "moved, not deleted"
    assert _tier(daemon, "disk").used_blocks == 0
    assert _tier(daemon, "disk").model_uid == other.model_uid
