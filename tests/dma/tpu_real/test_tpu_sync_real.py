"""dma.backend = "tpu_sync" against TPU Sync's real wheel (tpu-sync-jax), on JAX's CPU.

Run by `make test` in .venv-tpu (Python 3.12) with JAX_PLATFORMS=cpu and
TPU_SKIP_MDS_QUERY=1. Nothing here is skipped: without the wheel the import below fails.
What this does not show: anything about a TPU (its DMA engine, pinned memory, the tiled
layout of host blocks, the published GB/s). The manager's transport listener opens on the
wildcard address; these tests send it nothing.
"""

from __future__ import annotations

import base64
import gc
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jax
import numpy as np
import pytest
from tpu_sync.api.jax.kv_cache_manager import KVCacheManager

from agentpark.config import Settings
from agentpark.dma import HostCopyTransfer, TpuSyncShm, TpuSyncTransfer, select_transfer
from agentpark.dma.tpu_sync import default_manager_factory
from agentpark.engine.reference import ModelSpec, PoolSpec, ReferenceEngine
from agentpark.tiers.base import BackendHeldTier
from agentpark.tiers.dram import DramTier
from tests.dma.tpu_real.counting import CountingManager
from tests.harness import Daemon, DaemonProcess, free_port, write_config

NUM_BLOCKS = 32
HOST_BLOCKS = 16
TPU_SYNC = {"backend": "tpu_sync", "tpu_sync_on_cpu": True}


@pytest.fixture
def engine() -> ReferenceEngine:
    return ReferenceEngine(
        ModelSpec(max_seq_len=256), PoolSpec(block_size=16, num_blocks=NUM_BLOCKS)
    )


@pytest.fixture
def original(engine: ReferenceEngine) -> np.ndarray:
    """Random bytes in every block of the pool (written by host_copy's donated scatter)."""
    rng = np.random.default_rng(5)
    scratch = DramTier(engine.geometry, engine.geometry.total_bytes)
    (buf,) = scratch.buffers()
    buf[...] = rng.integers(0, 2**16, size=buf.shape, dtype=np.uint16)
    HostCopyTransfer().h2d(scratch, scratch.allocate("fill", NUM_BLOCKS), engine, list(range(32)))
    return buf.copy()


@pytest.fixture
def counted(engine: ReferenceEngine) -> tuple[TpuSyncTransfer, list[CountingManager]]:
    managers: list[CountingManager] = []
    real = default_manager_factory()

    def factory(kv_caches: list[jax.Array], host_blocks: int) -> CountingManager:
        managers.append(CountingManager(real(kv_caches, host_blocks)))
        return managers[-1]

    return TpuSyncTransfer(engine, HOST_BLOCKS, manager_factory=factory), managers


def _pool(engine: ReferenceEngine) -> np.ndarray:
    return np.asarray(engine.kv_pool()[0]).copy()


def test_round_trip_through_the_real_manager_is_bit_exact_into_other_blocks(
    engine: ReferenceEngine,
    original: np.ndarray,
    counted: tuple[TpuSyncTransfer, list[CountingManager]],
) -> None:
    transfer, managers = counted
    tier = BackendHeldTier("dram", engine.geometry, HOST_BLOCKS)
    tier.allocate("head", 3)
    slots = tier.allocate("s", 7)
    blocks = [9, 10, 11, 2, 5, 6, 20]
    transfer.d2h(engine, blocks, tier, slots)
    (manager,) = managers
    assert isinstance(manager.real, KVCacheManager)
    assert manager.calls == [("d2h", [9, 2, 5, 20], [3, 6, 7, 9], [3, 1, 2, 1])]
    np.testing.assert_array_equal(_pool(engine), original)  # a pause leaves the pool alone

    # Another session decodes in between (20 tokens into blocks 30 and 31): the donated
    # step keeps the pool where TPU Sync was bound.
    engine.extend([30, 31], 0, list(range(20)))
    decoded = _pool(engine)
    assert not np.array_equal(decoded[30], original[30])

    targets = [20, 21, 22, 0, 1, 2, 29]
    transfer.h2d(tier, slots, engine, targets)
    assert manager.calls[1:] == [("h2d", [3, 6, 9], [20, 0, 29], [3, 3, 1])]
    pool = _pool(engine)
    np.testing.assert_array_equal(pool[targets], original[blocks])
    untouched = [b for b in range(NUM_BLOCKS) if b not in targets]
    np.testing.assert_array_equal(pool[untouched], decoded[untouched])


def test_the_real_future_has_wait_and_is_ready(engine: ReferenceEngine) -> None:
    manager = KVCacheManager(engine.kv_pool(), 0, host_blocks_to_allocate=2)
    future = manager.d2h([1], [0], [2])
    future.wait()
    assert future.is_ready() is True


def test_bad_offsets_and_lengths_are_refused_before_any_call(
    engine: ReferenceEngine,
    original: np.ndarray,
    counted: tuple[TpuSyncTransfer, list[CountingManager]],
) -> None:
    transfer, managers = counted
    tier = BackendHeldTier("dram", engine.geometry, HOST_BLOCKS)
    transfer.start()
    cases: list[tuple[str, list[int], list[int]]] = [
        ("2 block ids but 1 slots", [0, 1], [0]),
        (r"tier slots \[16\] out of range 0..15", [0], [HOST_BLOCKS]),
        (r"block ids \[32\] out of range 0..31", [NUM_BLOCKS], [0]),
        (r"block ids \[-1\] out of range", [-1], [0]),
        (r"tier slots \[-2\] out of range", [0], [-2]),
        ("duplicate", [3, 3], [0, 1]),
    ]
    for message, blocks, slots in cases:
        with pytest.raises(ValueError, match=message):
            transfer.d2h(engine, blocks, tier, slots)
        with pytest.raises(ValueError, match=message):
            transfer.h2d(tier, slots, engine, blocks)
    big = BackendHeldTier("dram", engine.geometry, HOST_BLOCKS + 1)
    with pytest.raises(ValueError, match="17 slots but TPU Sync holds 16 host blocks"):
        transfer.d2h(engine, [0], big, [0])
    (manager,) = managers
    assert manager.calls == []
    np.testing.assert_array_equal(_pool(engine), original)
    # What the library itself does with them: the CALL raises (not wait()), so without our
    # check the error would only say INVALID_ARGUMENT.
    with pytest.raises(RuntimeError, match="INVALID_ARGUMENT"):
        manager.real.d2h([-1], [0], [1])
    with pytest.raises(RuntimeError, match="exceeds destination host buffer"):
        manager.real.d2h([0], [HOST_BLOCKS - 1], [2])


def test_select_transfer_builds_it_on_cpu_only_when_opted_in(engine: ReferenceEngine) -> None:
    from agentpark.errors import ConfigError

    with pytest.raises(ConfigError, match=r"set dma\.tpu_sync_on_cpu = true"):
        select_transfer("tpu_sync", engine=engine, host_blocks=4)
    transfer = select_transfer("tpu_sync", engine=engine, host_blocks=4, tpu_sync_on_cpu=True)
    assert isinstance(transfer, TpuSyncTransfer) and transfer.bound


def _logits(body: dict[str, Any]) -> bytes:
    return base64.b64decode(body["logits"])


def test_daemon_pause_resume_is_bit_exact_like_a_never_paused_twin(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    daemon = daemon_factory(make_settings(dma=TPU_SYNC))
    assert isinstance(daemon.runtime.driver.transfer, TpuSyncTransfer)
    c = daemon.client
    prompt = {"prompt": "Search the web for the weather in Lisbon.", "max_new_tokens": 32}
    for sid in ("parked", "twin"):
        assert c.post("/v1/sessions", json={"session_id": sid}).status_code == 201
    first = c.post("/v1/sessions/parked/generate", json=prompt).json()
    twin_first = c.post("/v1/sessions/twin/generate", json=prompt).json()
    assert first["tokens"] == twin_first["tokens"]

    kv_bytes = c.get("/v1/sessions/parked").json()["kv_bytes"]
    paused = c.post("/v1/sessions/parked/pause", json={"tool": "web_search"}).json()
    assert (paused["state"], paused["tier"], paused["kv_bytes"]) == ("parked", "dram", kv_bytes)
    assert c.get("/v1/host").json()["tiers"]["dram"]["used_bytes"] == kv_bytes
    # Another session decodes while this one is parked (its old blocks are reused).
    c.post("/v1/sessions/twin/generate", json={"max_new_tokens": 1})
    c.post("/v1/sessions", json={"session_id": "filler"})
    c.post("/v1/sessions/filler/generate", json={"prompt": "x" * 200, "max_new_tokens": 4})

    resumed = c.post("/v1/sessions/parked/resume").json()
    assert resumed["restored_from"] == "dram"
    nxt = {"max_new_tokens": 1, "return_logits": True}
    c.post("/v1/sessions/parked/generate", json=nxt)  # the twin is one token ahead
    second = c.post("/v1/sessions/parked/generate", json=nxt | {"max_new_tokens": 24}).json()
    twin_second = c.post("/v1/sessions/twin/generate", json=nxt | {"max_new_tokens": 24}).json()
    assert second["tokens"] == twin_second["tokens"] and len(second["tokens"]) == 24
    assert _logits(second) == _logits(twin_second)


@pytest.fixture
def shm_cleanup(tmp_path: Path) -> Iterator[Path]:
    state_dir = tmp_path / "state"
    yield state_dir
    gc.collect()  # a KVCacheManager that dies later re-creates its .lock file
    shm = TpuSyncShm(state_dir)
    for path in shm.root.glob(f"{shm.key}_dev_*"):
        path.unlink()


FIRST = {"prompt": "Plan a trip; call the flight search tool.", "max_new_tokens": 20}
NEXT = {"max_new_tokens": 12, "return_logits": True}


def test_kill_9_then_restart_resumes_from_tpu_syncs_shm_segments_bit_exact(
    shm_cleanup: Path,
    make_settings: Callable[..., Settings],
    daemon_process: Callable[[Path, int], DaemonProcess],
    tmp_path: Path,
) -> None:
    settings = make_settings(state_dir=shm_cleanup)
    config = write_config(tmp_path / "agentpark.toml", settings)
    with config.open("a") as out:
        out.write('[dma]\nbackend = "tpu_sync"\ntpu_sync_on_cpu = true\ntpu_sync_shm = true\n')
    port = free_port()
    first = daemon_process(config, port)
    for sid in ("a", "b"):
        first.client.post("/v1/sessions", json={"session_id": sid})
        first.client.post(f"/v1/sessions/{sid}/generate", json=FIRST)
        parked = first.client.post(f"/v1/sessions/{sid}/pause").json()
        assert (parked["state"], parked["tier"]) == ("parked", "dram")
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL

    shm = TpuSyncShm(shm_cleanup)
    segments = shm.segments()
    assert segments, "TPU Sync's segments are gone after kill -9"
    for path in segments:
        st = path.lstat()
        assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o600), path
    assert (shm_cleanup / "tpu_sync-shm.json").stat().st_mode & 0o777 == 0o600

    second = daemon_process(config, port)
    c: httpx.Client = second.client
    assert c.get("/v1/sessions/a").json()["state"] == "parked"
    c.post("/v1/sessions", json={"session_id": "twin"})
    c.post("/v1/sessions/twin/generate", json=FIRST)
    reference = c.post("/v1/sessions/twin/generate", json=NEXT).json()
    for sid in ("a", "b"):
        resumed = c.post(f"/v1/sessions/{sid}/resume").json()
        assert resumed["restored_from"] == "dram", resumed
        out = c.post(f"/v1/sessions/{sid}/generate", json=NEXT).json()
        assert out["tokens"] == reference["tokens"]
        assert out["logits"] == reference["logits"]
    assert second.stop(signal.SIGKILL) == -signal.SIGKILL


def test_segments_of_another_layout_are_moved_aside_before_tpu_sync_sees_them(
    shm_cleanup: Path,
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
) -> None:
    # A previous daemon's segments and layout record, for a pool of 32 blocks (the daemon
    # below has 64): TPU Sync would zero them; agentpark must not hand them over. Made in a
    # child process, as a previous daemon would (a manager lives until its process exits).
    shm_cleanup.mkdir(parents=True)
    previous = f"""
from pathlib import Path
from agentpark.dma import TpuSyncShm, TpuSyncTransfer
from agentpark.engine.reference import ModelSpec, PoolSpec, ReferenceEngine
old = ReferenceEngine(ModelSpec(max_seq_len=512), PoolSpec(block_size=16, num_blocks=32))
shm = TpuSyncShm(Path({str(shm_cleanup)!r}))
TpuSyncTransfer(old, 8, shm=shm).start()
assert not shm.reattached and shm.attach_problem is None
"""
    subprocess.run([sys.executable, "-c", previous], check=True, capture_output=True)
    segments = TpuSyncShm(shm_cleanup).segments()
    assert segments

    daemon = daemon_factory(
        make_settings(state_dir=shm_cleanup, dma=TPU_SYNC | {"tpu_sync_shm": True})
    )
    (tier,) = daemon.runtime.parking.tiers.values()
    assert tier.persistent and not tier.reattached
    problem = tier.attach_problem
    assert "model_uid is" in problem, problem
    for path in segments:
        (aside,) = path.parent.glob(f"{path.name}.mismatch-*")  # kept, never deleted
        aside.unlink()
    daemon.stop()
    # Let its manager go now: dying, it re-creates its .lock, which shm_cleanup removes.
    transfer = daemon.runtime.driver.transfer
    assert isinstance(transfer, TpuSyncTransfer)
    transfer._manager = None
