"""jax_memkind moves blocks bit-exact between a real JAX pool and a real tier, on CPU.

JAX's CPU platform has the device, pinned_host and unpinned_host memory kinds, so the backend
runs here exactly as written (slowly: it is the accelerator path).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import agentpark.dma.jax_memkind as jax_memkind
from agentpark.dma import HostCopyTransfer, JaxMemkindTransfer
from agentpark.engine.reference import ModelSpec, PoolSpec, ReferenceEngine
from agentpark.errors import TransferError
from agentpark.tiers.dram import DramTier

NUM_BLOCKS = 32


@pytest.fixture
def engine() -> ReferenceEngine:
    return ReferenceEngine(
        ModelSpec(max_seq_len=256), PoolSpec(block_size=16, num_blocks=NUM_BLOCKS)
    )


def _fill(engine: ReferenceEngine) -> np.ndarray:
    """Random bytes in every block of the pool (written with host_copy, the other backend)."""
    rng = np.random.default_rng(11)
    scratch = DramTier(engine.geometry, engine.geometry.total_bytes)
    (buf,) = scratch.buffers()
    buf[...] = rng.integers(0, 2**16, size=buf.shape, dtype=np.uint16)
    slots = scratch.allocate("fill", NUM_BLOCKS)
    HostCopyTransfer().h2d(scratch, slots, engine, list(range(NUM_BLOCKS)))
    return buf.copy()


def _pool(engine: ReferenceEngine) -> np.ndarray:
    return np.asarray(engine.kv_pool()[0]).copy()


def _fragmented_slots(tier: DramTier, n: int) -> list[int]:
    """``n`` slots for "s", neither consecutive nor in order: other owners hold the rest."""
    taken = [tier.allocate(("pad", i), 1)[0] for i in range(tier.capacity_blocks)]
    freed = [taken[i] for i in np.random.default_rng(n).permutation(range(1, 2 * n + 1, 2))]
    for slot in freed[:n]:
        tier.free(("pad", slot))
    slots = tier.allocate("s", n)
    assert slots == freed[:n]
    return slots


@pytest.mark.parametrize("max_chunk_blocks", [None, 2])
@pytest.mark.parametrize(
    ("blocks", "fragmented"),
    [
        ([5], False),
        ([0, 1, 2], False),  # 3: not a power of two
        ([9, 2, 17, 18, 19], True),  # 5, fragmented slots
        ([30, 3, 4, 5, 6, 12, 13], True),  # 7
        (list(range(NUM_BLOCKS - 1, -1, -1)), False),  # the whole pool, reversed
    ],
)
def test_round_trip_is_bit_exact_into_other_blocks(
    engine: ReferenceEngine, blocks: list[int], fragmented: bool, max_chunk_blocks: int | None
) -> None:
    original = _fill(engine)
    block_nbytes = engine.geometry.block_nbytes
    tier = DramTier(engine.geometry, 2 * NUM_BLOCKS * block_nbytes)
    (buf,) = tier.buffers()
    buf[...] = 0xABCD  # so a stray write to a slot that is not ours shows
    if fragmented:
        slots = _fragmented_slots(tier, len(blocks))
        assert any(b != a + 1 for a, b in itertools.pairwise(slots))
    else:
        tier.allocate("head", 3)  # so slots do not start at 0
        slots = tier.allocate("s", len(blocks))
    dma = (
        JaxMemkindTransfer()
        if max_chunk_blocks is None
        else JaxMemkindTransfer(max_chunk_bytes=max_chunk_blocks * block_nbytes)
    )

    dma.d2h(engine, blocks, tier, slots)
    np.testing.assert_array_equal(buf[slots], original[blocks])
    others = [s for s in range(tier.capacity_blocks) if s not in slots]
    assert (buf[others] == 0xABCD).all()
    np.testing.assert_array_equal(_pool(engine), original)  # a pause does not touch the pool

    targets = [(b + 11) % NUM_BLOCKS for b in blocks]  # restore into different blocks
    untouched = [b for b in range(NUM_BLOCKS) if b not in targets]
    dma.h2d(tier, slots, engine, targets)
    pool = _pool(engine)
    np.testing.assert_array_equal(pool[targets], original[blocks])
    np.testing.assert_array_equal(pool[untouched], original[untouched])


def test_restore_is_in_place_and_never_aliases_the_tier(engine: ReferenceEngine) -> None:
    original = _fill(engine)
    tier = DramTier(engine.geometry, 8 * engine.geometry.block_nbytes)
    slots = tier.allocate("s", 3)
    dma = JaxMemkindTransfer()
    dma.d2h(engine, [4, 5, 6], tier, slots)
    before = engine.kv_pool()[0].unsafe_buffer_pointer()
    dma.h2d(tier, slots, engine, [20, 21, 22])
    assert engine.kv_pool()[0].unsafe_buffer_pointer() == before, "the pool was not donated"

    tier.buffers()[0][...] = 0  # the tier's slots are reused by the next pause
    np.testing.assert_array_equal(_pool(engine)[[20, 21, 22]], original[[4, 5, 6]])


def test_copies_go_through_the_device_and_pinned_host_memory_kinds(
    engine: ReferenceEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(engine)
    kinds: list[str | None] = []
    real_device_put = jax.device_put

    def recording_device_put(x: Any, device: Any = None, **kwargs: Any) -> Any:
        kinds.append(getattr(device, "memory_kind", "?"))
        return real_device_put(x, device, **kwargs)

    monkeypatch.setattr(jax, "device_put", recording_device_put)
    tier = DramTier(engine.geometry, 8 * engine.geometry.block_nbytes)
    slots = tier.allocate("s", 5)
    dma = JaxMemkindTransfer(max_chunk_bytes=4 * engine.geometry.block_nbytes)
    dma.d2h(engine, [1, 2, 3, 4, 5], tier, slots)
    assert kinds == ["pinned_host", "pinned_host"]  # two chunks: 4 blocks, then 1
    kinds.clear()
    dma.h2d(tier, slots, engine, [7, 8, 9, 10, 11])
    assert kinds == ["device", "device"]


def test_a_failed_pause_raises_transfer_error_and_leaves_the_tier(
    engine: ReferenceEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = _fill(engine)
    tier = DramTier(engine.geometry, 4 * engine.geometry.block_nbytes)
    slots = tier.allocate("s", 2)

    def broken(*args: Any) -> Any:
        raise RuntimeError("DMA engine on fire")

    monkeypatch.setattr(jax_memkind, "_gather_rows", broken)
    with pytest.raises(TransferError, match=r"pause copy .* failed: DMA engine on fire"):
        JaxMemkindTransfer().d2h(engine, [3, 4], tier, slots)
    assert (tier.buffers()[0] == 0).all()
    assert tier.used_blocks == 2
    np.testing.assert_array_equal(_pool(engine), original)


def test_a_failed_restore_raises_transfer_error_and_keeps_the_parked_copy(
    engine: ReferenceEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = _fill(engine)
    tier = DramTier(engine.geometry, 4 * engine.geometry.block_nbytes)
    slots = tier.allocate("s", 2)
    dma = JaxMemkindTransfer()
    dma.d2h(engine, [3, 4], tier, slots)
    parked = tier.buffers()[0].copy()

    def broken(*args: Any) -> Any:
        raise RuntimeError("no HBM")

    monkeypatch.setattr(jax_memkind, "_scatter_rows", broken)
    with pytest.raises(TransferError, match=r"restore copy .* failed: no HBM"):
        dma.h2d(tier, slots, engine, [10, 11])
    np.testing.assert_array_equal(tier.buffers()[0], parked)
    np.testing.assert_array_equal(_pool(engine), original)


def test_bad_arguments_are_refused(engine: ReferenceEngine) -> None:
    tier = DramTier(engine.geometry, 4 * engine.geometry.block_nbytes)
    dma = JaxMemkindTransfer()
    with pytest.raises(ValueError, match="2 block ids but 1 slots"):
        dma.d2h(engine, [0, 1], tier, [0])
    with pytest.raises(ValueError, match=r"block ids \[32\] out of range 0..31"):
        dma.h2d(tier, [0], engine, [NUM_BLOCKS])
    with pytest.raises(ValueError, match=r"tier slots \[4\] out of range 0..3"):
        dma.d2h(engine, [0], tier, [4])
    with pytest.raises(ValueError, match="max_chunk_bytes must be positive"):
        JaxMemkindTransfer(max_chunk_bytes=0)
    dma.d2h(engine, [], tier, [])  # nothing to do is not an error


_SHARDED_SCRIPT = textwrap.dedent(
    """
    import threading
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from agentpark.dma import JaxMemkindTransfer
    from agentpark.blocks import ArraySpec, BlockAllocator, PoolGeometry
    from agentpark.tiers.dram import DramTier

    assert len(jax.devices()) == 4, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("heads",))
    sharding = NamedSharding(mesh, P(None, "heads", None))  # block axis unsharded

    class Engine:  # the DMA core's part of the adapter, over a K and a V pool array
        def __init__(self):
            self.geometry = PoolGeometry(16, 4, (ArraySpec((8, 6), "uint16"),) * 2)
            self.allocator = BlockAllocator(16)
            self.lock = threading.RLock()
            rng = np.random.default_rng(3)
            self.original = [
                rng.integers(0, 2**16, size=(16, 8, 6), dtype=np.uint16) for _ in range(2)
            ]
            self.pool = [jax.device_put(a, sharding) for a in self.original]
        def kv_pool(self):
            return list(self.pool)
        def set_kv_pool(self, arrays):
            self.pool = list(arrays)

    engine = Engine()
    tier = DramTier(engine.geometry, 8 * engine.geometry.block_nbytes)
    tier.allocate("head", 2)
    slots = tier.allocate("s", 5)
    blocks, targets = [3, 4, 5, 11, 0], [12, 13, 1, 2, 9]
    dma = JaxMemkindTransfer()
    dma.d2h(engine, blocks, tier, slots)
    for buf, orig in zip(tier.buffers(), engine.original):
        np.testing.assert_array_equal(buf[slots], orig[blocks])
    dma.h2d(tier, slots, engine, targets)
    for arr, orig in zip(engine.kv_pool(), engine.original):
        assert arr.sharding.is_equivalent_to(sharding, arr.ndim), arr.sharding
        got = np.asarray(arr)
        np.testing.assert_array_equal(got[targets], orig[blocks])
        rest = [b for b in range(16) if b not in targets]
        np.testing.assert_array_equal(got[rest], orig[rest])
    print("sharded round trip ok")
    """
)


def test_sharded_pool_on_four_cpu_devices(tmp_path: Path) -> None:
    """A pool sharded over 4 devices (heads axis) round-trips bit-exact, sharding kept."""
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
        "JAX_PLATFORMS": "cpu",
    }
    script = tmp_path / "sharded.py"
    script.write_text(_SHARDED_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "sharded round trip ok" in done.stdout
