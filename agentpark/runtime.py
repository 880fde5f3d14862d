"""Wires one daemon together: database, engine, DMA backend, tiers and parking."""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

from agentpark.config import PolicySettings, Settings, load_settings
from agentpark.control.vllm import VllmService
from agentpark.engine.reference import ReferenceEngine
from agentpark.errors import ConfigError, InvalidRequestError
from agentpark.history import HostSampler
from agentpark.kvevents import Advertiser
from agentpark.kvevents import start as start_kv_events
from agentpark.metrics import KvEventsCollector, Metrics
from agentpark.parking import InProcessDriver, SessionCore, drain
from agentpark.parts import StoreParts, open_store, reference_parts, vllm_parts
from agentpark.policy.service import PolicyService
from agentpark.snapshot import HostSnapshot
from agentpark.statedir import StateLock
from agentpark.store.db import StorageProbe, WalCheckpointer
from agentpark.store.repository import SessionStore
from agentpark.store.retention import Retention, RetentionStore
from agentpark.store.samples import SampleStore
from agentpark.tiers.capabilities import WarmsUp

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
    kv_events: Advertiser | None = None  # [kv_events] endpoint: parked blocks for routers

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
        """Every part from :mod:`agentpark.parts` (the one composition root)."""
        parts = open_store(settings.database_url)
        try:
            if settings.vllm.enabled:
                vllm = vllm_parts(settings, parts.store)
                return cls._assemble(settings, config_path, parts, vllm.driver.core, vllm)
            reference = reference_parts(settings, parts.store)
        except BaseException:
            parts.store.close()
            raise
        runtime = cls._assemble(settings, config_path, parts, reference.driver.core, None)
        runtime.engine, runtime.driver = reference.engine, reference.driver
        return runtime

    @classmethod
    def _assemble(
        cls,
        settings: Settings,
        config_path: Path | None,
        parts: StoreParts,
        core: SessionCore,
        vllm: VllmService | None,
    ) -> Runtime:
        """Metrics, history, policy and the WAL checkpointer around one session core."""
        ready = threading.Event()
        listen = f"{settings.server.host}:{settings.server.port}"

        def snapshot() -> HostSnapshot:
            view = core.snapshot(ready=ready.is_set(), listen=listen)
            if vllm is not None:
                view.degraded = vllm.degraded.total()
                view.pins = vllm.driver.turn_ends.pins.figures()
            return view

        metrics = Metrics(snapshot, core.live_sessions, host_label(settings))
        core.add_listener(metrics.observe)
        sampler = HostSampler(
            snapshot,
            SampleStore(parts.db_engine, parts.db_sessions),
            settings.dashboard,
            retention=Retention(RetentionStore(parts.db_engine), settings.retention),
        )
        store = parts.store
        policy = PolicyService(core, store, settings.policy)
        runtime = cls(
            settings, store, None, None, metrics, sampler, policy, ready, False, config_path
        )
        runtime.checkpointer = WalCheckpointer(parts.db_engine)
        runtime.checkpointer.start()
        interval = settings.reliability.storage_probe_s
        runtime.probe = StorageProbe(store.health, store.probe, interval)
        runtime.probe.start()
        if settings.kv_events.endpoint:
            runtime.kv_events = start_kv_events(settings.kv_events, core)
            collector = KvEventsCollector(runtime.kv_events.figures, host_label(settings))
            metrics.registry.register(collector)
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
        view = self.parking.snapshot(
            ready=self.ready.is_set(), listen=f"{server.host}:{server.port}"
        )
        if self.vllm is not None:
            view.degraded = self.vllm.degraded.total()
            view.pins = self.vllm.driver.turn_ends.pins.figures()
        return view

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
            if self.kv_events is not None:
                self.kv_events.stop()
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
