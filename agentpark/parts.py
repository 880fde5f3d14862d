"""The part factories every assembly of the session core is built from (one composition root).

The daemon (:class:`~agentpark.runtime.Runtime`), its vLLM service and ``agentpark bench
transfer`` build the same parts the same way from one :class:`~agentpark.config.Settings`:

    open_store(url)                       -> migrated SQLite, the session store
    core_options(settings)                -> checksummed tiers, yields, admission wait
    reference_parts(settings, store)      -> reference engine, DMA backend, tiers, core
    vllm_parts(settings, store)           -> the external manager and its control socket

Tiers come from :mod:`agentpark.tiers.factory` (the one tier factory), DMA backends from
:func:`agentpark.dma.select_transfer`; nothing here is built a second way elsewhere.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from agentpark.config import Settings
from agentpark.control.vllm import VllmService
from agentpark.dma import HostCopyTransfer, TpuSyncShm, TpuSyncTransfer, Transfer, select_transfer
from agentpark.engine.reference import ModelSpec, PoolSpec, ReferenceEngine
from agentpark.enums import Tier
from agentpark.errors import ConfigError
from agentpark.parking import CoreOptions, InProcessDriver, in_process_core
from agentpark.store.db import open_database
from agentpark.store.migrate import upgrade
from agentpark.store.repository import SessionStore
from agentpark.tiers.base import BackendHeldTier, HostTier
from agentpark.tiers.factory import build_tiers
from agentpark.tiers.filetier import orphaned

__all__ = [
    "ReferenceParts",
    "StoreParts",
    "core_options",
    "open_store",
    "reference_parts",
    "settle_orphans",
    "vllm_parts",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreParts:
    """The session store and the SQLAlchemy engine and session factory under it (the
    history sampler and retention share them)."""

    store: SessionStore
    db_engine: Any
    db_sessions: Any


def open_store(database_url: str) -> StoreParts:
    """The database migrated to the current schema, opened, and its session store."""
    upgrade(database_url)
    db_engine, db_sessions = open_database(database_url)
    return StoreParts(SessionStore(db_engine, db_sessions), db_engine, db_sessions)


def core_options(settings: Settings) -> CoreOptions:
    """What the session core takes from the settings."""
    checksums = settings.integrity.checksum != "none"
    return CoreOptions(
        checksum_tiers=frozenset(settings.integrity.tiers) if checksums else frozenset(),
        background_yield_s=settings.limits.background_yield_s,
        admission_timeout_s=settings.limits.admission_timeout_s,
        key_algo=settings.vllm.block_hash,
        key_seed=settings.vllm.none_hash_seed,
        anonymous_share=settings.vllm.anonymous_share,
        anonymous_ttl_s=settings.vllm.anonymous_ttl_s,
    )


def vllm_parts(settings: Settings, store: SessionStore) -> VllmService:
    """The external core for vLLM: its pool, its manager, its control socket (not started)."""
    return VllmService(settings, store, core_options(settings))


@dataclass(frozen=True)
class ReferenceParts:
    """The reference engine and the in-process driver (its core, transfer and tiers)."""

    engine: ReferenceEngine
    driver: InProcessDriver


def reference_parts(settings: Settings, store: SessionStore) -> ReferenceParts:
    """The reference engine, its DMA backend and tiers, and the in-process core over them.

    On failure everything built so far is closed (the store stays the caller's).
    """
    engine = ReferenceEngine(
        ModelSpec(**settings.model.model_dump()), PoolSpec(**settings.pool.model_dump())
    )
    tiers: list[HostTier]
    transfer: Transfer
    if settings.dma.backend == "tpu_sync":
        # TPU Sync keeps parked bytes in its own host memory, in the TPU's tiled layout: one
        # bookkeeping-only tier, and nothing agentpark could copy to shm or disk. With
        # dma.tpu_sync_shm that memory is TPU Sync's /dev/shm segments: the tier persists.
        tiers, transfer = _tpu_sync_parts(settings, engine)
    else:
        transfer = select_transfer(
            settings.dma.backend,
            copy_threads=settings.dma.copy_threads,
            hash_thread=settings.dma.hash_thread,
            native_copy=settings.dma.native_copy,
        )
        tiers = build_tiers(settings, engine.geometry, engine.model_uid)
        try:
            settle_orphans(store, tiers, settings.reliability.tier_files)
        except BaseException:
            for tier in tiers:
                tier.close()
            raise
    driver = in_process_core(
        store,
        engine,
        transfer,
        tiers,
        max_new_tokens=settings.limits.max_new_tokens,
        options=core_options(settings),
    )
    log.info(
        "pool: %d blocks of %d bytes (%d tokens each); tiers: %s; dma: %s",
        engine.geometry.num_blocks,
        engine.geometry.block_nbytes,
        engine.geometry.block_size,
        ", ".join(f"{t.name}={t.capacity_blocks} blocks" for t in tiers) or "none",
        f"{transfer.name} ({transfer.copy_loop})"
        if isinstance(transfer, HostCopyTransfer)
        else transfer.name,
    )
    return ReferenceParts(engine, driver)


def settle_orphans(store: SessionStore, tiers: list[HostTier], mode: str) -> None:
    """Tier files with parked data next to a database that knows no session (a new or
    emptied agentpark.db): refuse to start (ConfigError, exit 2), adopt or discard them.

    ``adopt``: the file stays as it is and every slot counts as free; no session can be
    attached to its bytes (their index was in the database), which new pauses overwrite.
    ``discard``: the file is moved aside (:func:`agentpark.tiers.aside.move_aside`, never
    deleted at once) and a new, empty one made.
    """
    if store.knows_sessions():
        return
    found = orphaned(tiers)
    if not found:
        return
    names = ", ".join(str(t.path) for t in found)
    if mode == "refuse":
        raise ConfigError(
            f"tier files hold parked data but the database ({store.url}) knows no session: "
            f"{names}. Was agentpark.db removed or replaced? Put it back, or start with "
            "--tier-files adopt (keep the files, every slot free) or --tier-files discard "
            "(move them aside) (config: reliability.tier_files)",
            files=[str(t.path) for t in found],
        )
    for tier in found:
        if mode == "adopt":
            log.warning(
                "%s tier: adopted %s: the database knows no session, so every slot is free "
                "(the bytes there belong to no session and are overwritten by new pauses)",
                tier.name,
                tier.path,
            )
        else:
            aside = tier.discard()
            log.warning(
                "%s tier: discarded %s (the database knows no session): moved it to %s and "
                "started a new file",
                tier.name,
                tier.path,
                aside,
            )


def _tpu_sync_parts(
    settings: Settings, engine: ReferenceEngine
) -> tuple[list[HostTier], TpuSyncTransfer]:
    """The one tier TPU Sync holds the bytes of, and the started transfer over it."""
    dma = settings.dma
    checked = set(settings.integrity.tiers) if settings.integrity.checksum != "none" else set()
    if Tier.DRAM in checked:
        raise ConfigError(
            "integrity.tiers includes 'dram', but with dma.backend = 'tpu_sync' the dram "
            "tier's bytes live in TPU Sync's host memory, which agentpark cannot read to "
            "checksum: drop 'dram' from integrity.tiers"
        )
    capacity = int(settings.tiers.dram.capacity) // engine.geometry.block_nbytes
    shm = TpuSyncShm(settings.state_dir) if dma.tpu_sync_shm else None
    tier = BackendHeldTier(Tier.DRAM, engine.geometry, capacity, persistent=shm is not None)
    transfer = select_transfer(
        "tpu_sync",
        engine=engine,
        host_blocks=capacity,
        tpu_sync_on_cpu=dma.tpu_sync_on_cpu,
        tpu_sync_shm=shm,
    )
    assert isinstance(transfer, TpuSyncTransfer)
    if shm is not None:
        tier.reattached, tier.attach_problem = shm.reattached, shm.attach_problem
    return [tier], transfer
