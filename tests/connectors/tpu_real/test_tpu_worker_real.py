"""The connector's TPU worker side (agentpark.connectors.tpu) against TPU Sync's real wheel.

Run by `make test-tpu` in .venv-tpu (Python 3.12) with JAX_PLATFORMS=cpu and
TPU_SKIP_MDS_QUERY=1; nothing is skipped: without the wheel the import below fails. The
daemon is the real VllmService (SQLite file, control socket); the runner is a runner-like
object whose ``kv_caches`` list a donated jitted step replaces, as tpu-inference's does.
What this does not show: anything of a TPU (DMA engine, pinned memory, tiled host layout)
or of tpu-inference itself (that it calls ``register_runner`` and keeps the caches' device
memory across forwards).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tpu_sync.api.jax.kv_cache_manager import KVCacheManager

from agentpark.connectors.steps import LoadMeta, StoreMeta
from agentpark.connectors.tpu import INSTANCE_FILE, TpuWorker, runner_layout
from agentpark.connectors.tpu_sync_manager import default_manager_factory
from agentpark.connectors.tpu_sync_shm import TpuSyncShm
from agentpark.enums import State
from agentpark.tiers.base import BackendHeldTier
from tests.connectors.conftest import TENANT, ControlDaemon
from tests.connectors.tpu_real.kv import (
    BLOCK,
    HOST_BLOCKS,
    HOST_BYTES,
    MODEL_UID,
    NUM_BLOCKS,
    Runner,
    bits,
    blocks_of,
    forward,
    make_caches,
)
from tests.dma.tpu_real.counting import CountingManager

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def runner() -> Runner:
    return Runner(make_caches(seed=1))


@pytest.fixture
def managers() -> list[CountingManager]:
    return []


@pytest.fixture
def make_worker(
    control_daemon: ControlDaemon, runner: Runner, managers: list[CountingManager]
) -> Callable[..., TpuWorker]:
    real = default_manager_factory()

    def factory(kv_caches: list[jax.Array], host_blocks: int) -> CountingManager:
        managers.append(CountingManager(real(kv_caches, host_blocks)))
        return managers[-1]

    def make(**overrides: Any) -> TpuWorker:
        kwargs: dict[str, Any] = {
            "block_size": BLOCK,
            "model_uid": MODEL_UID,
            "host_bytes": HOST_BYTES,
            "manager_factory": factory,
        }
        return TpuWorker(control_daemon.client, runner, **(kwargs | overrides))

    return make


def _plan(daemon: ControlDaemon, session_id: str, blocks: list[int]) -> dict[str, Any]:
    tokens = list(range(100, 100 + len(blocks) * BLOCK))
    return daemon.plan_park(session_id, tokens, blocks)


def _store(plan: dict[str, Any], blocks: list[int], slots: list[int] | None = None) -> StoreMeta:
    slots = plan["slots"] if slots is None else slots
    return StoreMeta("req-park", plan["store_id"], blocks, slots, plan["checksum"], plan["pool_id"])


def _begin(daemon: ControlDaemon, session_id: str, n: int, targets: list[int]) -> dict[str, Any]:
    turn = [*range(100, 100 + n * BLOCK), 5]
    load = daemon.call(
        "begin_load", turn, tenant=TENANT, session_id=session_id, start_block=0, block_ids=targets
    )
    assert load["ok"], load
    return load


def _load(load: dict[str, Any], targets: list[int], slots: list[int] | None = None) -> LoadMeta:
    slots = load["slots"] if slots is None else slots
    return LoadMeta(
        "req-load",
        load["load_id"],
        targets,
        slots,
        load["digests"] if any(load["digests"]) else None,
        load["pool_id"],
    )


def test_runner_layout_reads_the_arrays_and_refuses_what_tpu_sync_cannot_copy(
    runner: Runner,
) -> None:
    layout = runner_layout(runner.kv_caches, BLOCK, MODEL_UID, NUM_BLOCKS)
    assert layout.num_blocks == NUM_BLOCKS and layout.kv_dtype == "jax.bfloat16"
    assert layout.arrays == (((BLOCK, 4, 64), "uint16"),) * 3
    with pytest.raises(ValueError, match="vLLM's KV cache config 31"):
        runner_layout(runner.kv_caches, BLOCK, MODEL_UID, 31)
    odd = [*runner.kv_caches[:2], runner.kv_caches[2][:8]]
    with pytest.raises(ValueError, match=r"kv_caches\[2\] \(8, 16, 4, 64\): not 32 blocks"):
        runner_layout(odd, BLOCK, MODEL_UID)
    mixed = [*runner.kv_caches[:2], runner.kv_caches[2].astype(jnp.float32)]
    with pytest.raises(ValueError, match="different dtypes"):
        runner_layout(mixed, BLOCK, MODEL_UID)
    with pytest.raises(ValueError, match=r"not a jax\.Array"):
        runner_layout([np.zeros((NUM_BLOCKS, 2))], BLOCK, MODEL_UID)  # type: ignore[list-item]


def test_a_park_then_a_load_into_other_blocks_is_bit_exact_across_donated_steps(
    control_daemon: ControlDaemon,
    runner: Runner,
    make_worker: Callable[..., TpuWorker],
    managers: list[CountingManager],
) -> None:
    daemon = control_daemon
    worker = make_worker()
    assert worker.register()
    service = daemon.service
    assert isinstance(service.tier, BackendHeldTier)
    assert service.tier.capacity_blocks == HOST_BLOCKS and not service.pool_path.exists()
    (manager,) = managers
    assert isinstance(manager.real, KVCacheManager)

    forward(runner, [0, 1], seed=2)  # a step before the turn ends: a new list
    original = bits(runner)
    blocks = [9, 10, 11, 2]
    plan = _plan(daemon, "agent-1", blocks)
    assert plan["checksum"] is False and plan["pool_id"] == worker.pool_id
    assert plan["slots"] == [0, 1, 2, 3]
    assert worker.run_stores([_store(plan, blocks)]) == {"req-park"}
    assert worker.run_stores([_store(plan, blocks)]) == set()  # once per store, any hook
    assert manager.calls == [("d2h", [9, 2], [0, 3], [3, 1])]
    row = service.driver.core.get(TENANT, "agent-1")
    assert (row.state, row.checksum) == (State.PARKED, None)

    # vLLM frees the blocks; other requests' steps overwrite them (and the load targets).
    before = runner.kv_caches
    forward(runner, [9, 10, 11, 2, 20, 21, 22, 23], seed=3)
    forward(runner, [30], seed=4)
    assert runner.kv_caches is not before
    stepped = bits(runner)
    assert not np.array_equal(stepped[0][9], original[0][9])

    targets = [20, 21, 22, 23]
    load = _begin(daemon, "agent-1", 4, targets)
    assert load["digests"] == [None] * len(load["slots"])  # TPU Sync's bytes: unchecked
    assert worker.run_loads([_load(load, targets)]) == set()
    assert manager.calls[1:] == [("h2d", [0], [20], [4])]  # one run on both sides
    for got, want in zip(blocks_of(runner, targets), original, strict=True):
        np.testing.assert_array_equal(got, want[blocks])
    untouched = [b for b in range(NUM_BLOCKS) if b not in targets]
    for got, want in zip(bits(runner), stepped, strict=True):
        np.testing.assert_array_equal(got[untouched], want[untouched])
    assert service.driver.core.get(TENANT, "agent-1").state == State.ACTIVE
    assert service.driver.core.counters.prefill_tokens_avoided == 4 * BLOCK
    # The next donated step still runs over the loaded blocks, in the same memory.
    forward(runner, [31], seed=5)
    for got, want in zip(blocks_of(runner, targets), original, strict=True):
        np.testing.assert_array_equal(got, want[blocks])


def test_bad_ids_and_slots_are_refused_before_any_tpu_sync_call(
    control_daemon: ControlDaemon,
    runner: Runner,
    make_worker: Callable[..., TpuWorker],
    managers: list[CountingManager],
) -> None:
    daemon = control_daemon
    worker = make_worker()
    assert worker.register()
    (manager,) = managers
    original = bits(runner)
    cases: list[tuple[str, list[int], list[int] | None]] = [
        ("block ids [32] out of range", [NUM_BLOCKS], None),
        ("block ids [-1] out of range", [-1], None),
        ("tier slots [16] out of range", [3], [HOST_BLOCKS]),
        ("duplicate block ids", [3, 3], None),
        ("2 block ids but 1 slots", [3, 4], [0]),
    ]
    for i, (message, blocks, slots) in enumerate(cases):
        plan = _plan(daemon, f"bad-{i}", [40 + j for j in range(len(blocks))])
        assert worker.run_stores([_store(plan, blocks, slots)]) == {"req-park"}
        row = daemon.service.driver.core.get(TENANT, f"bad-{i}")
        assert row.state == State.ACTIVE, message
        failed = daemon.store.events(TENANT, f"bad-{i}", 1)[0]
        assert failed.kind == "pause_failed" and message in (failed.detail or ""), failed
    assert manager.calls == []

    plan = _plan(daemon, "good", [5, 6])
    worker.run_stores([_store(plan, [5, 6])])
    assert [c[0] for c in manager.calls] == ["d2h"]
    bad_loads: list[tuple[list[int], list[int] | None]] = [
        ([NUM_BLOCKS, 0], None),
        ([1, 2], [HOST_BLOCKS, 0]),
        ([1, 1], None),
    ]
    for targets, slots in bad_loads:
        load = _begin(daemon, "good", 2, [1, 2])
        assert worker.run_loads([_load(load, targets, slots)]) == set(targets)
        assert daemon.service.driver.core.get(TENANT, "good").state == State.PARKED
        assert daemon.kinds("good")[-1] == "restore_failed"
    assert [c[0] for c in manager.calls] == ["d2h"]
    np.testing.assert_array_equal(bits(runner)[0], original[0])
    assert worker.client.counts["load_refused"] == 3


def test_caches_that_moved_in_device_memory_are_never_copied(
    control_daemon: ControlDaemon,
    runner: Runner,
    make_worker: Callable[..., TpuWorker],
    managers: list[CountingManager],
) -> None:
    worker = make_worker()
    assert worker.register()
    runner.kv_caches = [jnp.array(c, copy=True) for c in runner.kv_caches]  # not donated
    plan = _plan(control_daemon, "moved", [1, 2])
    worker.run_stores([_store(plan, [1, 2])])
    failed = control_daemon.store.events(TENANT, "moved", 1)[0]
    assert failed.kind == "pause_failed" and "moved in device memory" in (failed.detail or "")
    assert managers[0].calls == []


def test_a_copy_for_another_pool_is_not_run_and_the_worker_registers_again(
    control_daemon: ControlDaemon,
    runner: Runner,
    make_worker: Callable[..., TpuWorker],
    managers: list[CountingManager],
) -> None:
    daemon = control_daemon
    old = make_worker()
    assert old.register()
    plan = _plan(daemon, "s", [1, 2])
    old.run_stores([_store(plan, [1, 2])])
    assert daemon.service.driver.core.get(TENANT, "s").state == State.PARKED

    # vLLM restarted without shm: new host memory, whose blocks hold none of that copy.
    new = make_worker()
    assert new.pool_id != old.pool_id
    load = _begin(daemon, "s", 2, [7, 8])  # begun by the daemon for the OLD memory
    assert new.run_loads([_load(load, [7, 8])]) == {7, 8}
    assert all(m.calls == [] for m in managers[1:])
    assert daemon.service.pool_id == new.pool_id  # registered again from that load
    row = daemon.service.driver.core.get(TENANT, "s")
    assert row.state == State.LOST and "host memory is new" in (row.lost_reason or "")
    assert new.client.counts["load_pool_changed"] == 1


def test_a_daemon_restart_keeps_the_parked_copy_and_the_running_worker_loads_it(
    control_daemon: ControlDaemon,
    runner: Runner,
    make_worker: Callable[..., TpuWorker],
) -> None:
    daemon = control_daemon
    worker = make_worker()
    assert worker.register()
    original = bits(runner)
    plan = _plan(daemon, "s", [4, 5, 6])
    worker.run_stores([_store(plan, [4, 5, 6])])
    daemon.restart()
    worker.client = daemon.client  # the same worker process; its client reconnects
    assert daemon.service.driver.core.get(TENANT, "s").state == State.PARKED
    forward(runner, [4, 5, 6, 10, 11, 12], seed=7)
    load = _begin(daemon, "s", 3, [10, 11, 12])
    assert load["pool_id"] == worker.pool_id
    assert worker.run_loads([_load(load, [10, 11, 12])]) == set()
    for got, want in zip(blocks_of(runner, [10, 11, 12]), original, strict=True):
        np.testing.assert_array_equal(got, want[[4, 5, 6]])


@pytest.fixture
def tpu_shm_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "tpu-sync-shm"
    yield path
    gc.collect()
    shm = TpuSyncShm(path)
    for segment in shm.root.glob(f"{shm.key}_dev_*"):
        segment.unlink()


def _child(args: dict[str, Any]) -> dict[str, Any]:
    env = os.environ | {"PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.connectors.tpu_real.child", json.dumps(args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def test_a_vllm_restart_reattaches_tpu_syncs_shm_segments_and_the_next_turn_loads_them(
    control_daemon: ControlDaemon, tpu_shm_dir: Path, tmp_path: Path
) -> None:
    daemon = control_daemon
    base = {
        "socket": str(daemon.service.socket_path),
        "shm_dir": str(tpu_shm_dir),
        "session_id": "s",
        "tokens": list(range(100, 100 + 3 * BLOCK)),
    }
    first = _child(base | {"seed": 11, "do": "park", "blocks": [7, 3, 4]})
    assert first["register"]["kept"] is False
    assert daemon.service.driver.core.get(TENANT, "s").state == State.PARKED
    shm = TpuSyncShm(tpu_shm_dir)
    segments = shm.segments()
    assert segments, "TPU Sync's segments are gone with the first worker"
    for path in [*segments, tpu_shm_dir / INSTANCE_FILE]:
        st = path.lstat()
        assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o600), path

    out = tmp_path / "loaded.npy"
    second = _child(base | {"seed": 12, "do": "load", "targets": [20, 21, 22], "out": str(out)})
    assert second["pool_id"] == first["pool_id"] and second["register"]["kept"] is True
    assert second["invalid"] == []
    expected = np.stack(blocks_of(Runner(make_caches(11)), [7, 3, 4]))
    np.testing.assert_array_equal(np.load(out), expected)
    assert not np.array_equal(expected, np.stack(blocks_of(Runner(make_caches(12)), [20, 21, 22])))
    assert daemon.service.driver.core.get(TENANT, "s").state == State.ACTIVE


def test_a_worker_the_daemon_did_not_hear_at_its_start_registers_from_a_later_step(
    control_daemon: ControlDaemon, make_worker: Callable[..., TpuWorker]
) -> None:
    worker = make_worker()  # the manager is built without the daemon: the memory is ours
    assert control_daemon.service.tier is None and not worker.registered
    assert worker.maybe_register()  # what the connector's get_finished calls
    assert isinstance(control_daemon.service.tier, BackendHeldTier)
    assert control_daemon.service.pool_id == worker.pool_id
