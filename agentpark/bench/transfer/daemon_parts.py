"""The daemon's parts for ``agentpark bench transfer``: store, reference engine, the DMA
backend under test, the one tier and the in-process session core (no HTTP), built by the
daemon's own factories (:mod:`agentpark.parts`) from settings that name that one tier."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import jax

from agentpark.bench.transfer.geometry import MODEL, TOKEN_BYTES
from agentpark.config import Settings, load_settings
from agentpark.dma import Transfer
from agentpark.dma.host_copy import HostCopyTransfer, LastRestorePath
from agentpark.dma.jax_memkind import JaxMemkindTransfer
from agentpark.engine.reference import ReferenceEngine
from agentpark.parking import InProcessDriver, SessionCore
from agentpark.parts import open_store, reference_parts
from agentpark.store.repository import SessionStore
from agentpark.tiers.base import HostTier

__all__ = ["Stack", "bench_settings"]


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
        """The daemon's own parts (agentpark.parts) for these settings: the same store,
        engine, backend, tier and core a daemon builds, without HTTP or a policy loop."""
        settings = bench_settings(
            state_dir,
            tier_name,
            tier_dir,
            largest,
            block_tokens,
            backend=backend,
            copy_threads=copy_threads,
            hash_thread=hash_thread,
            native_copy=native_copy,
        )
        parts = open_store(settings.database_url)
        try:
            reference = reference_parts(settings, parts.store)
        except BaseException:
            parts.store.close()
            raise
        engine, driver = reference.engine, reference.driver
        transfer = driver.transfer
        (tier,) = driver.core.mover.tiers.values()
        filler: Transfer = transfer
        try:
            if backend == "tpu_sync":
                on_cpu = jax.default_backend() == "cpu"
                filler = HostCopyTransfer() if on_cpu else JaxMemkindTransfer()
            elif isinstance(transfer, HostCopyTransfer):
                transfer.observer = LastRestorePath()
                # Compile the restore scatter for every window size before anything is timed.
                transfer.warmup(engine, tier)
        except BaseException:
            driver.core.close()
            tier.close()
            parts.store.close()
            raise
        native_on = isinstance(transfer, HostCopyTransfer) and transfer.native_copy
        return cls(
            parts.store,
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


def bench_settings(
    state_dir: Path,
    tier_name: str,
    tier_dir: Path | None,
    largest: int,
    block_tokens: int,
    *,
    backend: str,
    copy_threads: int,
    hash_thread: bool,
    native_copy: bool,
) -> Settings:
    """A daemon's settings with the one tier under test (``largest`` bytes), the bench's
    model and a pool of its largest size plus a margin of free blocks (so a resumed session
    lands on other block ids than it left). Checksums off: the repeats turn them on for the
    tier under test and back."""
    block_nbytes = block_tokens * TOKEN_BYTES
    largest_blocks = largest // block_nbytes
    num_blocks = largest_blocks + max(4, largest_blocks // 8)
    model = {**dataclasses.asdict(MODEL), "max_seq_len": num_blocks * block_tokens}
    tiers: dict[str, dict[str, object]] = {
        "dram": {"capacity": 0},
        "shm": {"capacity": 0},
        "disk": {"capacity": 0},
    }
    if backend != "host_copy" or tier_name == "dram":
        tiers["dram"] = {"capacity": largest}
    else:
        assert tier_dir is not None
        tiers[tier_name] = {"capacity": largest, "path": tier_dir / f"{tier_name}-tier.bin"}
    return load_settings(
        None,
        state_dir=state_dir,
        model=model,
        pool={"block_size": block_tokens, "num_blocks": num_blocks},
        tiers=tiers,
        dma={
            "backend": backend,
            "copy_threads": copy_threads,
            "hash_thread": hash_thread,
            "native_copy": native_copy,
            "tpu_sync_on_cpu": True,
        },
        integrity={"checksum": "none"},
        limits={"max_new_tokens": 1},
    )
