"""The daemon's side of vLLM: the host pool, the external-engine core and the control ops.

With ``[vllm] enabled = true`` a daemon serves vLLM's agentpark connector instead of
running its reference engine. It owns the host pool, one shm tier file (the same
:class:`~agentpark.tiers.shm.ShmTier` as the reference mode), whose geometry is the
engine's, as its worker read it from the KV tensors and registered it. The file survives
a restart of vLLM (the worker maps it again) and of the daemon (the header names the
layout, so the tier re-attaches at start and recovery keeps its parked sessions).

A registration with another layout (another model, dtype or block size) refuses the old
file loudly: it is moved aside (never deleted), its sessions are LOST, a new file is made.

**Bytes held by the worker (vLLM on TPU, TPU Sync).** A worker that copies through TPU
Sync registers its layout with ``held`` (:class:`~agentpark.connectors.protocol.Held`):
TPU Sync keeps the parked bytes in its own host memory in the worker's process (pinned,
in the TPU's tiled layout), which no other process can read. The daemon then makes NO
pool file: its "shm" tier is a :class:`~agentpark.tiers.base.BackendHeldTier` (slot ``s``
= TPU Sync host block ``s``; the worker sized them), and it keeps only the bookkeeping: a
0600 record next to the pool path (``<pool_path>.held.json``) naming the layout and the
host memory's ``instance``. No checksum is claimed for those copies (agentpark cannot
read them), and they are never demoted to disk. A daemon restart re-attaches the record
(the bytes are in the worker, which kept running); a worker that registers another
instance (vLLM restarted without TPU Sync's shm segments) makes the parked copies LOST.

With a disk tier configured (``tiers.disk.capacity`` > 0) the daemon also owns a disk
file in the same layout: the policy loop demotes copies parked in the pool longer than
``policy.demote_after_s.shm`` to it (a host-to-host copy by the core's mover), and a
session's next turn promotes its copy back into the pool inside ``match``, before the
answer offers it: the worker only ever maps the pool file.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from agentpark.auth import Gate, TokenStore, is_loopback
from agentpark.blocks import ArraySpec, PoolGeometry
from agentpark.config import Settings
from agentpark.connectors.protocol import Held, Layout, PoolFile, ProtocolError
from agentpark.control.degraded import DegradedCounts, DegradedSink
from agentpark.control.handlers import ControlOps
from agentpark.control.server import ControlServer, Limits, default_socket_path
from agentpark.enums import Tier
from agentpark.parking import CoreOptions, ExternalDriver, external_core
from agentpark.store.repository import SessionStore
from agentpark.tiers.base import BackendHeldTier, HostTier
from agentpark.tiers.disk import DiskTier
from agentpark.tiers.filetier import FileTier, read_header
from agentpark.tiers.shm import ShmTier, default_shm_path

__all__ = ["VllmService", "held_pool_id", "vllm_held_path", "vllm_pool_path"]

log = logging.getLogger(__name__)

_UNREGISTERED = PoolGeometry(1, 1, (ArraySpec((1,), "uint8"),))


def vllm_pool_path(settings: Settings) -> Path:
    """The pool file: ``vllm.pool_path``, default the state dir's shm name + ``-vllm``."""
    configured = settings.vllm.pool_path
    if configured is not None:
        return configured
    default = default_shm_path(settings.state_dir)
    return default.with_name(f"{default.name}-vllm")


def vllm_held_path(settings: Settings) -> Path:
    """The record of a pool whose bytes the worker holds (TPU Sync): ``<pool>.held.json``."""
    pool = vllm_pool_path(settings)
    return pool.with_name(f"{pool.name}.held.json")


def held_pool_id(held: Held) -> str:
    """The pool id of worker-held bytes: the worker computes the same one itself."""
    return f"{held.backend}:{held.instance}"


def _geometry(layout: Layout) -> PoolGeometry:
    arrays = tuple(ArraySpec(tuple(shape), dtype) for shape, dtype in layout.arrays)
    return PoolGeometry(layout.num_blocks, layout.block_size, arrays)


class VllmService:
    """The external core for vLLM, its pool tier and the handlers of the control ops."""

    def __init__(
        self,
        settings: Settings,
        store: SessionStore,
        options: CoreOptions,
        *,
        limits: Limits | None = None,
    ) -> None:
        self.settings = settings
        self.capacity = int(settings.vllm.pool_capacity)
        self.pool_path = vllm_pool_path(settings)
        self.socket_path = settings.vllm.control_socket or default_socket_path(settings.state_dir)
        self._lock = threading.Lock()
        self.degraded = DegradedCounts()
        # Who a control connection is: as REST decides (the daemon's app replaces this gate
        # with its own, so both doors share one, its loopback default included).
        self._tokens = TokenStore.open(settings.database_url)
        self.gate = Gate(self._tokens, anonymous=is_loopback(settings.server.host))
        self.held_path = vllm_held_path(settings)
        self.tier: FileTier | BackendHeldTier | None = None
        self.disk: DiskTier | None = None
        self.pool_id: str | None = None
        self.held: Held | None = None  # set when the worker's backend holds the bytes
        geometry, model_uid = _UNREGISTERED, "vllm: no engine registered yet"
        if not self.pool_path.exists() and self.held_path.exists():
            try:
                layout, held = self._read_held()
                geometry, model_uid = _geometry(layout), layout.model_uid
                self.tier, self.held = self._held_tier(geometry, held), held
                self.pool_id = held_pool_id(held)
            except (OSError, ValueError, KeyError, TypeError, ProtocolError) as exc:
                log.error("vllm held-pool record %s unreadable (%s); ignored", self.held_path, exc)
                geometry, model_uid = _UNREGISTERED, "vllm: no engine registered yet"
        elif self.pool_path.exists():
            try:
                geometry, model_uid = self._header_geometry()
                self.tier = ShmTier(self.pool_path, geometry, self.capacity, model_uid)
                self.disk = self._disk_tier(geometry, model_uid)
                self.pool_id = self.pool_file(self.tier).pool_id
            except (ValueError, KeyError, TypeError, OSError) as exc:
                log.error(
                    "vllm pool %s: unreadable header (%s); made anew on registration",
                    self.pool_path,
                    exc,
                )
                geometry, model_uid = _UNREGISTERED, "vllm: no engine registered yet"
        tiers = self._tiers()
        self.driver: ExternalDriver = external_core(
            store, geometry, model_uid, tiers, options=options
        )
        self.driver.engine_blocks = 0
        self.ops = ControlOps(self)
        self.server = ControlServer(
            self.socket_path, self.ops.handle, self.ops.undelivered, self.ops.closed, limits
        )
        self._stop = threading.Event()
        self._reaper = threading.Thread(
            target=self._reap, name="agentpark-vllm-reaper", daemon=True
        )

    def _disk_tier(self, geometry: PoolGeometry, model_uid: str) -> DiskTier | None:
        """The disk tier in the engine's layout, or None when ``tiers.disk`` is off."""
        cfg = self.settings.tiers.disk
        if not cfg.capacity:
            return None
        path = cfg.path or self.settings.state_dir / "disk-tier.bin"
        return DiskTier(path, geometry, int(cfg.capacity), model_uid, self.settings.state_dir)

    def _tiers(self) -> list[HostTier]:
        """The pool, then the disk tier: parks go to the pool, demotion to disk."""
        return [t for t in (self.tier, self.disk) if t is not None]

    def _header_geometry(self) -> tuple[PoolGeometry, str]:
        header = read_header(self.pool_path)
        arrays = tuple(
            ArraySpec(tuple(int(d) for d in a["block_shape"]), str(a["dtype"]))
            for a in header["arrays"]
        )
        return PoolGeometry(1, int(header["block_size"]), arrays), str(header["model_uid"])

    # ---- life -----------------------------------------------------------------------------

    def start(self) -> None:
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

    # ---- registration ---------------------------------------------------------------------

    def register(self, layout: Layout) -> PoolFile:
        """A worker's layout -> the pool file it maps (made or re-attached for it)."""
        geometry = _geometry(layout)
        with self._lock:
            if isinstance(self.tier, BackendHeldTier):
                self._drop_held("the engine now registers a pool file in another layout")
            tier = self.tier
            same = (
                isinstance(tier, FileTier)
                and self.driver.model_uid == layout.model_uid
                and tier.geometry.block_size == geometry.block_size
                and tier.geometry.arrays == geometry.arrays
            )
            if same:
                self.driver.attach(geometry, layout.model_uid, None)
            else:
                if tier is not None:
                    log.error(
                        "vllm pool %s holds the layout of %s; the engine registering is %s: "
                        "refusing the old file (moved aside) and making a new one",
                        self.pool_path,
                        self.driver.model_uid,
                        layout.model_uid,
                    )
                    tier.close()
                    aside = self.pool_path.with_name(
                        f"{self.pool_path.name}.mismatch-{os.getpid()}-{id(tier)}"
                    )
                    self.pool_path.rename(aside)
                if self.disk is not None:
                    self.disk.close()  # its header names the old layout: moved aside below
                tier = ShmTier(self.pool_path, geometry, self.capacity, layout.model_uid)
                self.tier = tier
                self.disk = self._disk_tier(geometry, layout.model_uid)
                self.driver.attach(geometry, layout.model_uid, self._tiers())
            assert isinstance(tier, FileTier)
            pool = self.pool_file(tier)
            self.pool_id = pool.pool_id
            log.info(
                "vllm engine registered: %s, %d blocks of %d tokens, %d arrays, pool %s",
                layout.model_uid,
                layout.num_blocks,
                layout.block_size,
                len(layout.arrays),
                self.pool_path,
            )
            return pool

    def register_held(self, layout: Layout, held: Held) -> dict[str, Any]:
        """A worker whose DMA backend holds the bytes: slot bookkeeping only, no file.

        The same layout and instance keep what is parked (a daemon restart, or a worker
        that re-attached TPU Sync's shm segments); another instance (the host memory is
        new) or layout makes the parked copies LOST, after failing every copy in flight
        (they name slots of the old memory).
        """
        geometry = _geometry(layout)
        pool_id = held_pool_id(held)
        with self._lock:
            tier = self.tier
            same = (
                isinstance(tier, BackendHeldTier)
                and self.held == held
                and self.driver.model_uid == layout.model_uid
                and tier.geometry.block_size == geometry.block_size
                and tier.geometry.arrays == geometry.arrays
            )
            if same:
                self.driver.attach(geometry, layout.model_uid, None)
                kept = True
            else:
                if self.held is not None and self.held.instance != held.instance:
                    why = (
                        f"the engine's {held.backend} host memory is new (instance "
                        f"{held.instance}): the parked copies in the old one are gone"
                    )
                else:
                    why = f"the engine's KV layout changed ({layout.model_uid}): unusable"
                failed = self.driver.fail_all(why)
                if failed:
                    log.warning("vllm: %d copies in flight failed: %s", failed, why)
                if isinstance(tier, FileTier):
                    self._move_aside(tier)
                if self.disk is not None:
                    self.disk.close()
                    self.disk = None
                if self.settings.tiers.disk.capacity:
                    log.warning(
                        "vllm: tiers.disk is not used for a %s-held pool: agentpark cannot "
                        "read those bytes to demote them",
                        held.backend,
                    )
                tier = self._held_tier(geometry, held)
                self.tier = tier
                self.driver.attach(geometry, layout.model_uid, [tier], why)
                kept = False
            self._write_held(layout, held)
            self.held, self.pool_id = held, pool_id
            log.info(
                "vllm engine registered: %s, %d blocks of %d tokens, %d arrays; the parked "
                "bytes are held by %s (instance %s, %d host blocks)%s",
                layout.model_uid,
                layout.num_blocks,
                layout.block_size,
                len(layout.arrays),
                held.backend,
                held.instance,
                held.capacity_blocks,
                "; parked copies kept" if kept else "",
            )
            return {
                "pool_id": pool_id,
                "capacity_blocks": held.capacity_blocks,
                "kept": kept,
                "checksum": False,
            }

    @staticmethod
    def _held_tier(geometry: PoolGeometry, held: Held) -> BackendHeldTier:
        """The bookkeeping of worker-held slots. It is trusted to be there (``reattached``)
        until the worker registers another instance: the daemon cannot see that memory."""
        tier = BackendHeldTier(Tier.SHM, geometry, held.capacity_blocks, persistent=True)
        tier.reattached = True
        return tier

    def _drop_held(self, why: str) -> None:
        """Forget a worker-held pool (its record too): its parked copies become LOST."""
        failed = self.driver.fail_all(why)
        if failed:
            log.warning("vllm: %d copies in flight failed: %s", failed, why)
        self.driver.attach(self.driver.geometry, self.driver.model_uid, [], why)
        self.tier, self.held, self.pool_id = None, None, None
        self.held_path.unlink(missing_ok=True)

    def _move_aside(self, tier: FileTier) -> None:
        log.error(
            "vllm pool %s holds the layout of %s; the engine registering keeps its bytes "
            "in its own memory: refusing the old file (moved aside)",
            self.pool_path,
            self.driver.model_uid,
        )
        tier.close()
        aside = self.pool_path.with_name(f"{self.pool_path.name}.mismatch-{os.getpid()}-{id(tier)}")
        self.pool_path.rename(aside)

    def _write_held(self, layout: Layout, held: Held) -> None:
        record = {"format": 1, "layout": layout.to_wire(), "held": held.to_wire()}
        tmp = self.held_path.with_name(self.held_path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(record, out, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.held_path)

    def _read_held(self) -> tuple[Layout, Held]:
        record = json.loads(self.held_path.read_text())
        if record.get("format") != 1:
            raise ValueError(f"unknown format {record.get('format')!r}")
        return Layout.from_wire(record["layout"]), Held.from_wire(record["held"])

    def capacity_bytes(self) -> int:
        """The pool's size: ``vllm.pool_capacity``, or what the worker's backend holds."""
        tier = self.tier
        if isinstance(tier, BackendHeldTier):
            return tier.capacity_bytes
        return self.capacity

    def pool_file(self, tier: FileTier) -> PoolFile:
        header = read_header(tier.path)
        st = tier.path.stat()
        return PoolFile(
            str(tier.path),
            tier.file_bytes,
            tier.capacity_blocks,
            tier.region_offsets,
            tuple(a.block_nbytes for a in tier.geometry.arrays),
            f"{st.st_ino}-{header.get('created_at')}",
        )
