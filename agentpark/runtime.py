"""Wires one daemon together: database, engine, DMA backend, tiers and parking."""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentpark.config import PolicySettings, Settings, load_settings
from agentpark.control.vllm import VllmService
from agentpark.dma import (
    HostCopyTransfer,
    TpuSyncShm,
    TpuSyncTransfer,
    Transfer,
    select_transfer,
)
from agentpark.engine.reference import ModelSpec, PoolSpec, ReferenceEngine
from agentpark.enums import Tier
from agentpark.errors import ConfigError, InvalidRequestError
from agentpark.history import HostSampler
from agentpark.metrics import Metrics
from agentpark.parking import CoreOptions, InProcessDriver, SessionCore, drain, in_process_core
from agentpark.policy.service import PolicyService
from agentpark.snapshot import HostSnapshot
from agentpark.statedir import StateLock
from agentpark.store.db import StorageProbe, WalCheckpointer, open_database
from agentpark.store.migrate import upgrade
from agentpark.store.repository import SessionStore
from agentpark.store.retention import Retention, RetentionStore
from agentpark.store.samples import SampleStore
from agentpark.tiers.base import BackendHeldTier, HostTier
from agentpark.tiers.capabilities import WarmsUp
from agentpark.tiers.factory import build_tiers
from agentpark.tiers.filetier import orphaned

__all__ = ["Runtime"]

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    settings: Settings
    store: SessionStore
    engine: ReferenceEngine | None  # None: the daemon serves vLLM (``vllm``)
    driver: InProcessDriver | None
    metrics: Metrics
    sampler: HostSampler
    policy: PolicyService
    ready: threading.Event = field(default_factory=threading.Event)
    drained: bool = False
    config_path: Path | None = None  # what SIGHUP and /v1/admin/reload read again
    checkpointer: WalCheckpointer | None = None  # keeps WAL checkpoints off the request path
    state_lock: StateLock | None = None  # this daemon's hold on state_dir, dropped at shutdown
    probe: StorageProbe | None = None  # while writes fail, tries one now and then
    vllm: VllmService | None = None  # [vllm] enabled: the external core and control socket

    @classmethod
    def start(
        cls,
        settings: Settings,
        config_path: Path | None = None,
        *,
        state_lock: StateLock | None = None,
    ) -> Runtime:
        """Lock the state dir, migrate the database, build every part, re-attach sessions.

        ``state_lock``: the lock the caller already took on ``settings.state_dir`` (``agentpark
        serve`` takes it before binding the port); the runtime owns it from here on. Without
        one, the runtime takes it: a second daemon on the same state dir gets ConfigError.
        """
        lock = state_lock if state_lock is not None else StateLock.acquire(settings.state_dir)
        try:
            runtime = cls._build(settings, config_path)
        except BaseException:
            lock.release()
            raise
        runtime.state_lock = lock
        return runtime

    @classmethod
    def _build(cls, settings: Settings, config_path: Path | None) -> Runtime:
        upgrade(settings.database_url)
        db_engine, db_sessions = open_database(settings.database_url)
        store = SessionStore(db_engine, db_sessions)
        checksums = settings.integrity.checksum != "none"
        options = CoreOptions(
            checksum_tiers=frozenset(settings.integrity.tiers) if checksums else frozenset(),
            background_yield_s=settings.limits.background_yield_s,
            admission_timeout_s=settings.limits.admission_timeout_s,
        )
        if settings.vllm.enabled:
            vllm = VllmService(settings, store, options)
            return cls._assemble(
                settings, config_path, store, db_engine, db_sessions, vllm.driver.core, vllm
            )
        engine = ReferenceEngine(
            ModelSpec(**settings.model.model_dump()), PoolSpec(**settings.pool.model_dump())
        )
        tiers: list[HostTier]
        transfer: Transfer
        if settings.dma.backend == "tpu_sync":
            # TPU Sync keeps parked bytes in its own host memory, in the TPU's tiled layout:
            # one bookkeeping-only tier, and nothing agentpark could copy to shm or disk. With
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
                store.close()
                raise
        driver = in_process_core(
            store,
            engine,
            transfer,
            tiers,
            max_new_tokens=settings.limits.max_new_tokens,
            options=options,
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
        runtime = cls._assemble(
            settings, config_path, store, db_engine, db_sessions, driver.core, None
        )
        runtime.engine, runtime.driver = engine, driver
        return runtime

    @classmethod
    def _assemble(
        cls,
        settings: Settings,
        config_path: Path | None,
        store: SessionStore,
        db_engine: Any,
        db_sessions: Any,
        core: SessionCore,
        vllm: VllmService | None,
    ) -> Runtime:
        """Metrics, history, policy and the WAL checkpointer around one session core."""
        ready = threading.Event()
        listen = f"{settings.server.host}:{settings.server.port}"

        def snapshot() -> HostSnapshot:
            return core.snapshot(ready=ready.is_set(), listen=listen)

        metrics = Metrics(snapshot, core.live_sessions, host_label(settings))
        core.add_listener(metrics.observe)
        sampler = HostSampler(
            snapshot,
            SampleStore(db_engine, db_sessions),
            settings.dashboard,
            retention=Retention(RetentionStore(db_engine), settings.retention),
        )
        policy = PolicyService(core, store, settings.policy)
        runtime = cls(
            settings, store, None, None, metrics, sampler, policy, ready, False, config_path
        )
        runtime.checkpointer = WalCheckpointer(db_engine)
        runtime.checkpointer.start()
        interval = settings.reliability.storage_probe_s
        runtime.probe = StorageProbe(store.health, store.probe, interval)
        runtime.probe.start()
        if vllm is not None:
            vllm.add_degraded_sink(metrics.count_degraded)
            runtime.vllm = vllm
            vllm.start()
        return runtime

    @property
    def parking(self) -> SessionCore:
        """The session core (the state machine every route and the policy drive)."""
        if self.vllm is not None:
            return self.vllm.driver.core
        assert self.driver is not None
        return self.driver.core

    def host_snapshot(self) -> HostSnapshot:
        """What this daemon holds now (``GET /v1/host``, metrics, history, status)."""
        server = self.settings.server
        return self.parking.snapshot(
            ready=self.ready.is_set(), listen=f"{server.host}:{server.port}"
        )

    def warm_up(self) -> None:
        """Compile the engine's and the restore path's shapes, then report ready (/readyz)."""
        if self.engine is None or self.driver is None:
            # vLLM mode: the engine is vLLM's. The loop runs only its rules on parked copies
            # (demotion to disk, TTL); idle, pressure and prefetch would act on vLLM's
            # blocks, which the daemon cannot reach (PolicyService.engine_rules is False).
            self.ready.set()
            log.info("serving vLLM connectors on %s; ready", self.vllm and self.vllm.socket_path)
            self.policy.start()
            return
        try:
            self.engine.warmup()
            transfer = self.driver.transfer
            tiers = list(self.parking.tiers.values())
            if isinstance(transfer, WarmsUp) and tiers:
                transfer.warmup(self.engine, max(tiers, key=lambda t: t.capacity_blocks))
        except Exception:
            log.exception("engine warm-up failed; the daemon stays not ready")
            return
        self.ready.set()
        log.info("engine warm; ready")
        self.policy.start()

    def reload_policy(self) -> PolicySettings:
        """Re-read the config file (and AGENTPARK_*) and apply its policy section.

        A file that does not validate is refused with the reason; the old policy stays.
        Other sections need a restart and are left as they are.
        """
        try:
            fresh = load_settings(self.config_path)
        except ConfigError as exc:
            raise InvalidRequestError(
                f"config refused, the old policy stays: {exc.message}", config=str(self.config_path)
            ) from None
        self.policy.reload(fresh.policy)
        return fresh.policy

    def shutdown(self) -> None:
        """Finish background copies, drain to persistent tiers if configured, close.

        The state dir's lock goes last, even if something before it fails: a new daemon
        may start as soon as this one has let go of the database and the tier files.
        """
        try:
            self.policy.stop()
            if self.vllm is not None:
                self.vllm.stop()
            self.parking.close()
            if self.settings.shutdown.drain and not self.drained:
                self.drain()
            for tier in self.parking.tiers.values():
                tier.close()
            if self.checkpointer is not None:
                self.checkpointer.stop()
            if self.probe is not None:
                self.probe.stop()
            self.store.close()
        finally:
            if self.state_lock is not None:
                self.state_lock.release()

    def drain(self) -> dict[str, int]:
        """Park every session into shm/disk within the configured deadline (idempotent)."""
        if self.vllm is not None:
            # Parked copies are in the shm pool already; the rest is vLLM's, not ours to move.
            self.parking.draining = True
            self.drained = True
            return {"parked": 0, "moved": 0, "already_safe": len(self.parking.registry), "lost": 0}
        summary = drain(self.parking, self.settings.shutdown.deadline_s)
        self.drained = True
        return summary


def host_label(settings: Settings) -> str:
    """The ``host`` label of this daemon's metrics and history (default: the hostname)."""
    return settings.dashboard.host_label or socket.gethostname()


def settle_orphans(store: SessionStore, tiers: list[HostTier], mode: str) -> None:
    """Tier files with parked data next to a database that knows no session (a new or
    emptied agentpark.db): refuse to start (ConfigError, exit 2), adopt or discard them.

    ``adopt``: the file stays as it is and every slot counts as free; no session can be
    attached to its bytes (their index was in the database), which new pauses overwrite.
    ``discard``: the file is moved aside (``<name>.discarded-<ns>``, never deleted) and a
    new, empty one made.
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
