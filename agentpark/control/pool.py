"""The vLLM host pool's life: its file (or the worker-held bookkeeping), the disk tier in
its layout, and what ``register`` does to them.

``register`` cannot break the daemon: a new layout's pool file (and disk file) is made
under a fresh unguessable name beside the old one and verified (size, header) before the
old one is let go; only then is the old file moved aside (once: ``tiers.aside``) and the
new one renamed into its place. A refusal (a full /dev/shm, a file size limit) removes
what it made and leaves the daemon exactly as it was, serving the old pool.

**Bytes held by the worker (vLLM on TPU, TPU Sync).** A worker that copies through TPU
Sync registers its layout with ``held``: the daemon then makes NO pool file; its pool tier
is a :class:`~agentpark.tiers.base.BackendHeldTier` (slot ``s`` = TPU Sync host block
``s``) and it keeps only a 0600 record next to the pool path (``<pool_path>.held.json``)
naming the layout and the host memory's ``instance``. A daemon restart re-attaches the
record; a worker that registers another instance makes the parked copies LOST.

The pool file is sparse (made in milliseconds, memory taken as sessions park), sized by
``[vllm] pool_capacity`` or else the rule of :mod:`agentpark.connectors.sizing`. A worker
that registers again (its wait ran out, its connection was renewed) is not a restarted
engine: only another engine (the connection's owner names vLLM's ``engine_id``, new at each
vLLM start) makes the sessions whose KV vLLM held (ACTIVE with tokens) LOST.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from agentpark.blocks import ArraySpec, PoolGeometry
from agentpark.config import Settings
from agentpark.connectors.protocol import Held, Layout, PoolFile, ProtocolError
from agentpark.connectors.sizing import kv_cache_bytes, sized_pool
from agentpark.enums import Tier
from agentpark.errors import ConfigError
from agentpark.parking import ExternalManager
from agentpark.tiers.aside import move_aside, staging
from agentpark.tiers.base import BackendHeldTier, HostTier
from agentpark.tiers.disk import DiskTier
from agentpark.tiers.factory import disk_path, disk_tier, shm_tier, vllm_held_path, vllm_pool_path
from agentpark.tiers.filetier import FileTier
from agentpark.tiers.header import read_header

__all__ = ["UNREGISTERED", "PoolManager", "held_pool_id", "layout_geometry"]

log = logging.getLogger(__name__)

UNREGISTERED = PoolGeometry(1, 1, (ArraySpec((1,), "uint8"),))
_NO_ENGINE = "vllm: no engine registered yet"


def held_pool_id(held: Held) -> str:
    """The pool id of worker-held bytes: the worker computes the same one itself."""
    return f"{held.backend}:{held.instance}"


def layout_geometry(layout: Layout) -> PoolGeometry:
    return PoolGeometry.from_layout(layout.num_blocks, layout.block_size, layout.arrays)


def _same(tier: HostTier | None, geometry: PoolGeometry, model_uid: str, uid: str) -> bool:
    return (
        tier is not None
        and model_uid == uid
        and tier.geometry.block_size == geometry.block_size
        and tier.geometry.arrays == geometry.arrays
    )


class PoolManager:
    """The pool tier and disk tier of a vLLM daemon, made, re-attached or replaced."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        configured = settings.vllm.pool_capacity  # None: sized at register by the rule
        self.configured: int | None = None if configured is None else int(configured)
        self.capacity = self.configured or 0
        self.engine: str | None = None  # who registered last (a connection's owner)
        self.pool_path = vllm_pool_path(settings)
        self.held_path = vllm_held_path(settings)
        self.lock = threading.Lock()
        self.tier: FileTier | BackendHeldTier | None = None
        self.disk: DiskTier | None = None
        self.pool_id: str | None = None
        self.held: Held | None = None  # set when the worker's backend holds the bytes
        self.geometry, self.model_uid = UNREGISTERED, _NO_ENGINE
        self._driver: ExternalManager | None = None
        self._recover()

    # ---- start -------------------------------------------------------------------------

    def _recover(self) -> None:
        """Re-attach what a previous daemon left: a pool file, or a worker-held record."""
        if not self.pool_path.exists() and self.held_path.exists():
            try:
                layout, held = self._read_held()
            except (OSError, ValueError, KeyError, TypeError, ProtocolError) as exc:
                log.error("vllm held-pool record %s unreadable (%s); ignored", self.held_path, exc)
                return
            self.geometry, self.model_uid = layout_geometry(layout), layout.model_uid
            self.tier, self.held = self._held_tier(self.geometry, held), held
            self.pool_id = held_pool_id(held)
        elif self.pool_path.exists():
            try:
                geometry, model_uid, blocks = self._header_geometry()
                if self.configured is None:  # the size it was made with
                    self.capacity = blocks * geometry.block_nbytes
                tier = shm_tier(
                    self.settings, self.pool_path, geometry, self.capacity, model_uid, sparse=True
                )
            except (ValueError, KeyError, TypeError, OSError, ConfigError) as exc:
                log.error(
                    "vllm pool %s: unusable (%s); made anew on registration", self.pool_path, exc
                )
                return
            try:
                self.disk = disk_tier(self.settings, geometry, model_uid)
            except BaseException:
                tier.close()
                raise
            self.tier, self.geometry, self.model_uid = tier, geometry, model_uid
            self.pool_id = self.pool_file(tier).pool_id

    def _header_geometry(self) -> tuple[PoolGeometry, str, int]:
        header = read_header(self.pool_path)
        arrays = tuple(
            ArraySpec(tuple(int(d) for d in a["block_shape"]), str(a["dtype"]))
            for a in header["arrays"]
        )
        geometry = PoolGeometry(1, int(header["block_size"]), arrays)
        return geometry, str(header["model_uid"]), int(header["capacity_blocks"])

    def tiers(self) -> list[HostTier]:
        """The pool, then the disk tier: parks go to the pool, demotion to disk."""
        return [t for t in (self.tier, self.disk) if t is not None]

    def bind(self, driver: ExternalManager) -> None:
        """The core the pool's tiers serve (it is built from :meth:`tiers`)."""
        self._driver = driver

    @property
    def driver(self) -> ExternalManager:
        assert self._driver is not None, "PoolManager.bind() first"
        return self._driver

    def capacity_bytes(self) -> int:
        """The pool file's size (0 until sized), or what the worker's backend holds."""
        tier = self.tier
        return tier.capacity_bytes if isinstance(tier, BackendHeldTier) else self.capacity

    def pool_bytes_for(self, layout: Layout) -> int:
        """A new pool's size: ``vllm.pool_capacity``, else the size rule's (logged)."""
        if self.configured is not None:
            return self.configured
        size, how = sized_pool(kv_cache_bytes(layout.num_blocks, layout.arrays))
        log.info("vllm pool: %s; [vllm] pool_capacity sets another size", how)
        return size

    def pool_file(self, tier: FileTier) -> PoolFile:
        """How a worker maps ``tier``'s file; read from the open file, not its path."""
        header = tier.header()
        return PoolFile(
            str(tier.path),
            tier.file_bytes,
            tier.capacity_blocks,
            tier.region_offsets,
            tuple(a.block_nbytes for a in tier.geometry.arrays),
            f"{tier.identity[1]}-{header.get('created_at')}",
        )

    # ---- register a pool file --------------------------------------------------------

    def register(self, layout: Layout, engine: str | None = None) -> PoolFile:
        """A worker's layout -> the pool file it maps (re-attached, or made for it).

        ``engine``: who registers (module docstring). ConfigError when a new file cannot
        be made; nothing has changed then.
        """
        geometry = layout_geometry(layout)
        with self.lock:
            tier = self.tier
            if isinstance(tier, FileTier) and _same(
                tier, geometry, self.driver.model_uid, layout.model_uid
            ):
                if engine is None or engine != self.engine:
                    self.driver.attach(geometry, layout.model_uid, None)
                else:
                    log.info("vllm: %s registered again (not a restart): sessions kept", engine)
            else:
                tier = self._replace(layout, geometry)
            self.engine = engine
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

    def _replace(self, layout: Layout, geometry: PoolGeometry) -> FileTier:
        """Make the new files, verify them, then let the old ones go (caller holds lock)."""
        new_pool, new_disk = self._make(layout, geometry)
        old_pool, old_disk = self.tier, self.disk
        why = f"the engine's KV layout changed ({layout.model_uid}): the parked copy is unusable"
        if isinstance(old_pool, BackendHeldTier):
            why = "the engine now registers a pool file in another layout"
        try:
            swapped = [self._swap(self.pool_path, new_pool)]
            if new_disk is not None:
                swapped.append(self._swap(disk_path(self.settings), new_disk))
        except OSError as exc:
            for tier in (new_pool, new_disk):
                if tier is not None:
                    tier.close()
                    with contextlib.suppress(OSError):
                        tier.path.unlink()
            raise ConfigError(f"vllm pool: cannot put the new file in place: {exc}") from None
        # From here on nothing can fail: the new files are in place; the old ones go.
        failed = self.driver.fail_all(why)
        if failed:
            log.warning("vllm: %d copies in flight failed: %s", failed, why)
        if old_pool is not None:
            log.error(
                "vllm pool %s held the layout of %s; the engine registering is %s: the old "
                "file is moved aside and its parked sessions are lost",
                self.pool_path,
                self.driver.model_uid,
                layout.model_uid,
            )
            old_pool.close()
        if old_disk is not None:
            old_disk.close()
        if isinstance(old_pool, BackendHeldTier):
            self.held_path.unlink(missing_ok=True)
            self.held = None
        self.tier, self.disk = new_pool, new_disk
        self.capacity = self.configured or new_pool.capacity_bytes
        self.driver.attach(geometry, layout.model_uid, self.tiers(), why)
        return new_pool

    def _make(self, layout: Layout, geometry: PoolGeometry) -> tuple[FileTier, DiskTier | None]:
        """The new pool (and disk) file under staging names, made and verified."""
        uid = layout.model_uid
        capacity = self.pool_bytes_for(layout)
        try:
            pool = shm_tier(
                self.settings,
                staging(self.pool_path),
                geometry,
                capacity,
                uid,
                fresh=True,
                sparse=True,
            )
        except OSError as exc:
            raise ConfigError(f"vllm pool: cannot make a new file: {exc}") from None
        try:
            self._verify(pool)
            disk_at = disk_path(self.settings)
            disk = disk_tier(self.settings, geometry, uid, path=staging(disk_at), fresh=True)
            if disk is not None:
                self._verify(disk)
        except BaseException as exc:
            pool.close()
            pool.path.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise ConfigError(f"vllm disk tier: cannot make a new file: {exc}") from None
            raise
        return pool, disk

    @staticmethod
    def _verify(tier: FileTier) -> None:
        """The made file is whole and says what it should, read back through its fd."""
        header = tier.header()
        expected = tier.expected_header()
        bad = [k for k in expected if header.get(k) != expected[k]]
        if bad or tier.missing() is not None:
            with contextlib.suppress(OSError):
                tier.close()
                tier.path.unlink()
            raise ConfigError(f"{tier.name}: the new file at {tier.path} did not verify ({bad})")

    @staticmethod
    def _swap(path: Path, new: FileTier) -> Path | None:
        """Move what is at ``path`` aside (once) and rename ``new`` there."""
        aside = move_aside(path, "replaced by a new layout") if os.path.lexists(path) else None
        try:
            new.rename(path)
        except OSError:
            if aside is not None:
                with contextlib.suppress(OSError):
                    aside.rename(path)
            raise
        return aside

    # ---- worker-held bytes ---------------------------------------------------------

    def register_held(self, layout: Layout, held: Held) -> dict[str, Any]:
        """A worker whose DMA backend holds the bytes: slot bookkeeping only, no file.

        The same layout and instance keep what is parked (a daemon restart, or a worker
        that re-attached TPU Sync's shm segments); another instance (the host memory is
        new) or layout makes the parked copies LOST, after failing every copy in flight
        (they name slots of the old memory).
        """
        geometry = layout_geometry(layout)
        pool_id = held_pool_id(held)
        with self.lock:
            tier = self.tier
            same = (
                isinstance(tier, BackendHeldTier)
                and self.held == held
                and _same(tier, geometry, self.driver.model_uid, layout.model_uid)
            )
            if same:
                self.driver.attach(geometry, layout.model_uid, None)
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
                    log.error(
                        "vllm pool %s: the engine registering keeps its bytes in its own "
                        "memory: the old file is moved aside",
                        self.pool_path,
                    )
                    tier.close()
                    if os.path.lexists(self.pool_path):
                        move_aside(self.pool_path, "the engine now holds its own bytes")
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
                "; parked copies kept" if same else "",
            )
            return {
                "pool_id": pool_id,
                "capacity_blocks": held.capacity_blocks,
                "kept": same,
                "checksum": False,
            }

    @staticmethod
    def _held_tier(geometry: PoolGeometry, held: Held) -> BackendHeldTier:
        """The bookkeeping of worker-held slots. It is trusted to be there (``reattached``)
        until the worker registers another instance: the daemon cannot see that memory."""
        tier = BackendHeldTier(Tier.SHM, geometry, held.capacity_blocks, persistent=True)
        tier.reattached = True
        return tier

    def _write_held(self, layout: Layout, held: Held) -> None:
        record = {"format": 1, "layout": layout.to_wire(), "held": held.to_wire()}
        tmp = self.held_path.with_name(self.held_path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
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
