"""One size of ``agentpark bench transfer``: a session given synthetic KV, paused and
resumed through the session core ``repeats`` times beside the references, the checksum on
and off, the copy alone, and the pool compared with the parked bytes before and after."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from agentpark.bench.common import (
    BENCH_TENANT,
    park,
    pool_mismatch,
    prefaulted,
    restore,
    timed,
)
from agentpark.bench.transfer.daemon_parts import Stack
from agentpark.bench.transfer.geometry import TOKEN_BYTES
from agentpark.bench.transfer.references import PinnedPut, PlainFile, pool_device
from agentpark.bench.transfer.results import SizeResult, other_copier
from agentpark.dma import native
from agentpark.dma.host_copy import HostCopyTransfer, LastRestorePath
from agentpark.engine.base import EngineAdapter
from agentpark.integrity import checksum
from agentpark.parking import SessionCore
from agentpark.tiers.dram import DramTier

__all__ = ["TENANT", "bench_size"]

TENANT = BENCH_TENANT


def bench_size(
    stack: Stack,
    size: int,
    repeats: int,
    seed: int,
    step: Callable[[str], None],
    tier_dir: Path | None,
    ncopy: Callable[[np.ndarray, np.ndarray], None] | None = None,
) -> SizeResult:
    parking, engine, tier = stack.parking, stack.engine, stack.tier
    checksummed = stack.checksummed
    result = SizeResult(size, tier.name, copy_threads=stack.copy_threads, backend=stack.backend)
    session_id = f"kv-{size}"
    num_blocks = size // engine.geometry.block_nbytes
    num_tokens = size // TOKEN_BYTES
    rng = np.random.default_rng(seed)

    parking.create(TENANT, session_id, {"bench": "transfer", "kv_bytes": size})
    key = (TENANT, session_id)
    plain: PlainFile | None = None
    put: PinnedPut | None = None
    try:
        blocks = engine.allocator.allocate(key, num_blocks)
        expected = _fill_blocks(stack, blocks, rng)  # the bytes the session must get back
        tokens = rng.integers(0, engine.vocab_size, num_tokens).tolist()
        stack.driver.adopt_kv(TENANT, session_id, tokens, blocks, np.zeros(engine.vocab_size, "f4"))
        result.mismatch = pool_mismatch(engine, expected, blocks, "after fill")
        # The reference timed just before a pause (d2h) and a restore (h2d).
        ref_d2h: Callable[[], object]
        ref_h2d: Callable[[], object]
        if stack.backend == "jax_memkind":
            put = PinnedPut(size, pool_device(engine))
            ref_d2h, ref_h2d = put.d2h, put.h2d
        else:
            src, dst = prefaulted(size), prefaulted(size)
            ref_d2h, ref_h2d = partial(np.copyto, dst, src), partial(np.copyto, src, dst)

        def measure(name: str, fn: Callable[..., object], *args: object) -> None:
            op = result.op(name)
            op.ref1.append(timed(ref_h2d if name.startswith(("h2d", "restore")) else ref_d2h))
            if ncopy is not None:
                op.refn.append(timed(ncopy, dst, src))
            op.s.append(timed(fn, *args))

        if tier.name == "disk":
            assert tier_dir is not None
            plain = PlainFile(tier_dir / f"plain-{size}.bin", size)
        if result.exact:
            # Warm-up, untimed: SQLite, caches, the tier's pages. A pause whose tier slots
            # wrap around the end of the tier restores as two runs; cycling through the whole
            # tier once also meets every window shape (compiled by transfer.warmup already).
            ref_d2h()
            ref_h2d()
            if plain is not None:
                plain.write(src)
                plain.read(dst)
            for _ in range(-(-tier.capacity_blocks // num_blocks) + 1):
                _round_trip(parking, session_id, tier.name)
            after = _blocks_of(engine, key)
            result.mismatch = pool_mismatch(engine, expected, after, "after warm-up")
        step("warm-up")
        for _ in range(repeats if result.exact else 0):
            result.copy_before_pause_s.append(timed(ref_d2h))
            if ncopy is not None:
                result.ncopy_before_pause_s.append(timed(ncopy, dst, src))
            if plain is not None:
                result.file_write_s.append(timed(plain.write, src))
            result.pause_s.append(timed(park, parking, session_id, tier.name))
            if checksummed:
                slots = _parked_slots(parking, session_id)
                result.checksum_s.append(timed(checksum, tier, slots))
            step("pause")
            result.copy_before_restore_s.append(timed(ref_h2d))
            if ncopy is not None:
                result.ncopy_before_restore_s.append(timed(ncopy, src, dst))
            if plain is not None:
                result.file_read_s.append(timed(plain.read, dst))
            result.restore_s.append(timed(restore, parking, session_id, tier.name))
            seen = getattr(stack.transfer, "observer", None)
            if isinstance(seen, LastRestorePath) and seen.last is not None:
                stack.restore_paths.add(seen.last)
            step("restore")
            if checksummed:  # host_copy only (see agentpark.bench.transfer)
                parking.mover.checksum_tiers = frozenset({tier.name})
                try:
                    measure("pause+xxh3", park, parking, session_id, tier.name)
                    measure("restore+xxh3", restore, parking, session_id, tier.name)
                finally:
                    parking.mover.checksum_tiers = frozenset()
                step("checksum on")
            _copy_alone(stack, key, measure)
            step("copy alone")
        if result.exact:
            after = _blocks_of(engine, key)
            result.mismatch = pool_mismatch(engine, expected, after, "after repeats")
        step("verified")
    finally:
        if plain is not None:
            plain.close()
        if put is not None:
            put.close()
        parking.delete(TENANT, session_id)
    return result


def _copy_alone(stack: Stack, key: tuple[str, str], measure: Callable[..., None]) -> None:
    """The copy without the control plane: the session's blocks to spare tier slots and
    back into the same blocks (the same bytes), checksum off and on (off only for tpu_sync)."""
    engine, tier, dma = stack.engine, stack.tier, stack.transfer
    blocks = _blocks_of(engine, key)
    slots = tier.allocate("bench-copy-alone", len(blocks))
    digests = ((False, ""), (True, "+xxh3")) if stack.checksummed else ((False, ""),)
    try:
        for digest, suffix in digests:
            measure(f"d2h{suffix}", dma.d2h, engine, blocks, tier, slots, digest)
            measure(f"h2d{suffix}", dma.h2d, tier, slots, engine, blocks, digest)
        if stack.checksummed and isinstance(dma, HostCopyTransfer):
            # The other checksum path, in the same repeat: hash thread <-> fused.
            dma.hash_thread = not stack.hash_thread
            try:
                measure("d2h+xxh3 alt", dma.d2h, engine, blocks, tier, slots, True)
                measure("h2d+xxh3 alt", dma.h2d, tier, slots, engine, blocks, True)
            finally:
                dma.hash_thread = stack.hash_thread
            if native.available() is not None:
                # The other copy loop, in the same repeat: native kernel <-> numpy.
                other = other_copier(stack.native_copy)
                dma.native_copy = not stack.native_copy
                try:
                    for digest, suffix in digests:
                        measure(
                            f"d2h{suffix} {other}", dma.d2h, engine, blocks, tier, slots, digest
                        )
                        measure(
                            f"h2d{suffix} {other}", dma.h2d, tier, slots, engine, blocks, digest
                        )
                finally:
                    dma.native_copy = stack.native_copy
            # The restore through XLA's donated writes, in the same repeat (A/B).
            dma.in_place = False
            try:
                measure("h2d xla", dma.h2d, tier, slots, engine, blocks, False)
                measure("h2d+xxh3 xla", dma.h2d, tier, slots, engine, blocks, True)
            finally:
                dma.in_place = True
    finally:
        tier.free("bench-copy-alone")


def _round_trip(parking: SessionCore, session_id: str, tier: str) -> None:
    park(parking, session_id, tier)
    restore(parking, session_id, tier)


def _parked_slots(parking: SessionCore, session_id: str) -> list[int]:
    handle = parking.get(TENANT, session_id).parked_handle or {}
    return list(handle["slots"])


def _blocks_of(engine: EngineAdapter, key: tuple[str, str]) -> list[int]:
    return engine.allocator.owned(key)


def _fill_blocks(stack: Stack, blocks: list[int], rng: np.random.Generator) -> list[np.ndarray]:
    """Write seeded random pages into pool ``blocks`` with the DMA core (h2d from a scratch
    tier); returns the scratch tier's buffers (``[len(blocks), ...]``), i.e. what they hold."""
    engine = stack.engine
    scratch = DramTier(engine.geometry, len(blocks) * engine.geometry.block_nbytes)
    slots = scratch.allocate("fill", len(blocks))
    buffers = [buf[: len(blocks)] for buf in scratch.buffers()]
    for buf in buffers:
        flat = buf.reshape(len(blocks), -1).view(np.uint8)
        for row in flat:  # a block at a time keeps the temporaries small
            row[:] = np.frombuffer(rng.bytes(row.size), dtype=np.uint8)
    stack.filler.h2d(scratch, slots, engine, blocks)
    return buffers
