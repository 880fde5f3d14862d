"""The daemon's side of vLLM: the host pool, the external-engine core and the control ops.

With ``[vllm] enabled = true`` a daemon serves vLLM's agentpark connector instead of
running its reference engine. It owns the host pool, one shm tier file (the same
:class:`~agentpark.tiers.shm.ShmTier` as the reference mode), whose geometry is the
engine's, as its worker read it from the KV tensors and registered it. The file survives
a restart of vLLM (the worker maps it again) and of the daemon (the header names the
layout, so the tier re-attaches at start and recovery keeps its parked sessions).

The pool file's life (made, re-attached, replaced by ``register`` with another layout,
or bookkeeping only when the worker's DMA backend holds the bytes: TPU Sync) is
:class:`~agentpark.control.pool.PoolManager`'s; this module handles the control ops.

With a disk tier configured (``tiers.disk.capacity`` > 0) the daemon also owns a disk
file in the same layout: the policy loop demotes copies parked in the pool longer than
``policy.demote_after_s.shm`` to it (a host-to-host copy by the core's mover), and a
session's next turn promotes its copy back into the pool inside ``match``, before the
answer offers it: the worker only ever maps the pool file.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from agentpark.auth import Gate, TokenStore, is_loopback
from agentpark.config import Settings
from agentpark.connectors.protocol import Held, Layout, PoolFile
from agentpark.control.degraded import DegradedCounts, DegradedSink
from agentpark.control.handlers import ControlOps
from agentpark.control.pool import PoolManager, held_pool_id
from agentpark.control.server import ControlServer, Limits, default_socket_path
from agentpark.errors import StorageUnavailableError
from agentpark.parking import CoreOptions, ExternalManager, external_core
from agentpark.store.repository import SessionStore
from agentpark.tiers.base import BackendHeldTier
from agentpark.tiers.disk import DiskTier
from agentpark.tiers.factory import vllm_held_path, vllm_pool_path
from agentpark.tiers.filetier import FileTier

__all__ = ["VllmService", "held_pool_id", "vllm_held_path", "vllm_pool_path"]

log = logging.getLogger(__name__)


class VllmService:
    """The external core for vLLM, its pool, and the control socket that serves its ops."""

    def __init__(
        self,
        settings: Settings,
        store: SessionStore,
        options: CoreOptions,
        *,
        limits: Limits | None = None,
    ) -> None:
        self.settings = settings
        self.socket_path = settings.vllm.control_socket or default_socket_path(settings.state_dir)
        self.degraded = DegradedCounts()
        # Who a control connection is: as REST decides (the daemon's app replaces this gate
        # with its own, so both doors share one, its loopback default included).
        self._tokens = TokenStore.open(settings.database_url)
        self.gate = Gate(self._tokens, anonymous=is_loopback(settings.server.host))
        self.pool = PoolManager(settings)  # the pool file's life: control/pool.py
        self.driver: ExternalManager = external_core(
            store, self.pool.geometry, self.pool.model_uid, self.pool.tiers(), options=options
        )
        self.pool.bind(self.driver)
        self.driver.host.engine_blocks = 0
        self.ops = ControlOps(self)
        self.server = ControlServer(
            self.socket_path, self.ops.handle, self.ops.undelivered, self.ops.closed, limits
        )
        self._stop = threading.Event()
        self._reaper = threading.Thread(
            target=self._reap, name="agentpark-vllm-reaper", daemon=True
        )

    # What the op handlers and the API read of the pool (owned by :class:`PoolManager`).
    @property
    def pool_path(self) -> Path:
        return self.pool.pool_path

    @property
    def held_path(self) -> Path:
        return self.pool.held_path

    @property
    def tier(self) -> FileTier | BackendHeldTier | None:
        return self.pool.tier

    @property
    def disk(self) -> DiskTier | None:
        return self.pool.disk

    @property
    def pool_id(self) -> str | None:
        return self.pool.pool_id

    @property
    def held(self) -> Held | None:
        return self.pool.held

    # ---- life -----------------------------------------------------------------------------

    def start(self) -> None:
        # The first turn must not pay the first commit (a connector gives up after 50 ms).
        try:
            self.driver.core.store.warm_up()
        except StorageUnavailableError as exc:  # the first turn will say so; start anyway
            log.warning("vllm: warming the database up failed: %s", exc.message)
        self.server.start()
        self._reaper.start()

    def stop(self) -> None:
        self._stop.set()
        self.server.stop()
        if self._reaper.is_alive():
            self._reaper.join(timeout=5)
        self._tokens.close()

    def add_degraded_sink(self, sink: DegradedSink) -> None:
        self.degraded.add_sink(sink)

    def count_degraded(self, cause: str, n: int = 1, *, tenant: str | None = None) -> None:
        """Count requests served without agentpark; an unknown cause counts as ``other``."""
        self.degraded.count(cause, n, tenant)

    def _reap(self) -> None:
        timeout = self.settings.vllm.plan_timeout_s
        while not self._stop.wait(min(1.0, timeout / 4)):
            try:
                expired = self.driver.expire(timeout)
            except Exception:
                log.exception("vllm: expiring plans failed")
                continue
            if expired:
                log.warning("vllm: %d copies the engine never reported were failed", expired)
                self.count_degraded("engine_never_reported", expired)

    # ---- registration (control/pool.py) ----------------------------------------------------

    def register(self, layout: Layout, engine: str | None = None) -> PoolFile:
        """A worker's layout -> the pool file it maps (made or re-attached for it);
        ``engine`` registering again is not a restart of it (control/pool.py)."""
        return self.pool.register(layout, engine)

    def register_held(self, layout: Layout, held: Held) -> dict[str, Any]:
        """A worker whose DMA backend holds the bytes: slot bookkeeping only, no file."""
        return self.pool.register_held(layout, held)

    def capacity_bytes(self) -> int:
        """The pool's size: ``vllm.pool_capacity``, or what the worker's backend holds."""
        return self.pool.capacity_bytes()
