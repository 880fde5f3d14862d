"""The daemon's parts for ``agentpark bench transfer``, wired by hand: store, reference
engine, the DMA backend under test, the one tier and the in-process session core (no HTTP).

This is the bench's one copy of the wiring; it is kept as it was (a shared composition root
for the daemon, the vLLM service and this bench is to replace it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import jax

from agentpark.bench.transfer.geometry import MODEL, TOKEN_BYTES
from agentpark.dma import Transfer, select_transfer
from agentpark.dma.host_copy import HostCopyTransfer, LastRestorePath
from agentpark.dma.jax_memkind import JaxMemkindTransfer
from agentpark.engine.reference import PoolSpec, ReferenceEngine
from agentpark.parking import CoreOptions, InProcessDriver, SessionCore, in_process_core
from agentpark.store.db import open_database
from agentpark.store.migrate import upgrade
from agentpark.store.repository import SessionStore
from agentpark.tiers.base import BackendHeldTier, HostTier
from agentpark.tiers.disk import DiskTier
from agentpark.tiers.dram import DramTier
from agentpark.tiers.shm import ShmTier

__all__ = ["Stack"]


@dataclass
class Stack:
    """The real parts of one daemon with the one tier under test, built directly (no HTTP)."""

    store: SessionStore
    engine: ReferenceEngine
    transfer: Transfer
    tier: HostTier
    driver: InProcessDriver
    filler: Transfer  # writes the synthetic KV into the pool from a scratch dram tier
    copy_threads: int = 1  # host_copy's dma.copy_threads (1 for tpu_sync and jax_memkind)
    hash_thread: bool = False  # host_copy's dma.hash_thread
    backend: str = "host_copy"
    native_copy: bool = True  # host_copy's dma.native_copy (False where it is not built)
    # host_copy: which path the session core's timed restores took ("in place", "xla").
    restore_paths: set[str] = field(default_factory=set)

    @property
    def checksummed(self) -> bool:
        """Whether the checksum-on rows are measured: host_copy's only (agentpark.bench.transfer
        says why)."""
        return self.backend == "host_copy"

    @property
    def parking(self) -> SessionCore:
        return self.driver.core

    @classmethod
    def build(
        cls,
        state_dir: Path,
        tier_name: str,
        tier_dir: Path | None,
        largest: int,
        block_tokens: int,
        copy_threads: int = 1,
        backend: str = "host_copy",
        hash_thread: bool = False,
        native_copy: bool = True,
    ) -> Stack:
        url = f"sqlite:///{state_dir / 'agentpark.db'}"
        upgrade(url)
        store = SessionStore(*open_database(url))
        tier: HostTier | None = None
        try:
            block_nbytes = block_tokens * TOKEN_BYTES
            largest_blocks = largest // block_nbytes
            # A margin of free blocks, so a resumed session lands on other block ids than it
            # left.
            num_blocks = largest_blocks + max(4, largest_blocks // 8)
            model = dataclasses.replace(MODEL, max_seq_len=num_blocks * block_tokens)
            pool = PoolSpec(block_size=block_tokens, num_blocks=num_blocks)
            engine = ReferenceEngine(model, pool)
            assert engine.geometry.block_nbytes == block_nbytes
            transfer: Transfer
            filler: Transfer
            if backend == "tpu_sync":
                tier = BackendHeldTier("dram", engine.geometry, largest // block_nbytes)
                transfer = select_transfer(
                    "tpu_sync",
                    engine=engine,
                    host_blocks=tier.capacity_blocks,
                    tpu_sync_on_cpu=True,
                )
                on_cpu = jax.default_backend() == "cpu"
                filler = HostCopyTransfer() if on_cpu else JaxMemkindTransfer()
            elif backend == "jax_memkind":
                tier = DramTier(engine.geometry, largest)
                transfer = filler = select_transfer("jax_memkind")
            else:
                tier = _make_tier(tier_name, tier_dir, engine, largest)
                copier = HostCopyTransfer(
                    copy_threads=copy_threads,
                    hash_thread=hash_thread,
                    native_copy=native_copy,
                    observer=LastRestorePath(),
                )
                # Compile the restore scatter for every window size before anything is timed.
                copier.warmup(engine, tier)
                transfer = filler = copier
            # Checksums off; the repeats turn them on for the tier under test and back.
            options = CoreOptions(checksum_tiers=frozenset())
            driver = in_process_core(
                store, engine, transfer, [tier], max_new_tokens=1, options=options
            )
        except BaseException:
            if tier is not None:
                tier.close()
            store.close()
            raise
        native_on = isinstance(transfer, HostCopyTransfer) and transfer.native_copy
        return cls(
            store,
            engine,
            transfer,
            tier,
            driver,
            filler,
            copy_threads,
            hash_thread,
            backend,
            native_on,
        )

    def close(self) -> None:
        self.parking.close()
        if isinstance(self.transfer, HostCopyTransfer):
            self.transfer.close()  # its worker and hash threads
        self.tier.close()
        self.store.close()


def _make_tier(name: str, tier_dir: Path | None, engine: ReferenceEngine, size: int) -> HostTier:
    if name == "dram":
        return DramTier(engine.geometry, size)
    assert tier_dir is not None
    if name == "shm":
        return ShmTier(tier_dir / "shm-tier.bin", engine.geometry, size, engine.model_uid)
    return DiskTier(tier_dir / "disk-tier.bin", engine.geometry, size, engine.model_uid)
