"""The one place tiers are built from settings: the daemon and the vLLM pool both ask here.

Paths follow one rule: a configured path as given, else the state dir's private shm
folder (:func:`~agentpark.tiers.shm.shm_dir`) for shared memory and
``<state_dir>/disk-tier.bin`` for the disk tier.
"""

from __future__ import annotations

from pathlib import Path

from agentpark.blocks import PoolGeometry
from agentpark.config import Settings
from agentpark.tiers.base import HostTier
from agentpark.tiers.disk import DiskTier
from agentpark.tiers.dram import DramTier
from agentpark.tiers.shm import ShmTier, default_shm_path, shm_dir

__all__ = ["build_tiers", "disk_path", "disk_tier", "shm_tier", "vllm_held_path", "vllm_pool_path"]


def disk_path(settings: Settings) -> Path:
    """The disk tier's file: ``tiers.disk.path``, default ``<state_dir>/disk-tier.bin``."""
    return settings.tiers.disk.path or settings.state_dir / "disk-tier.bin"


def vllm_pool_path(settings: Settings) -> Path:
    """vLLM's pool file: ``vllm.pool_path``, default ``vllm-pool`` in the private shm folder."""
    configured = settings.vllm.pool_path
    return configured if configured is not None else shm_dir(settings.state_dir) / "vllm-pool"


def vllm_held_path(settings: Settings) -> Path:
    """The record of a pool whose bytes the worker holds (TPU Sync): ``<pool>.held.json``."""
    pool = vllm_pool_path(settings)
    return pool.with_name(f"{pool.name}.held.json")


def shm_tier(
    settings: Settings,
    path: Path,
    geometry: PoolGeometry,
    capacity_bytes: int,
    model_uid: str,
    *,
    fresh: bool = False,
    sparse: bool = False,
) -> ShmTier:
    """An shm tier file owned by this state dir (``fresh``: only make a new one;
    ``sparse``: made without touching its pages, the vLLM pool)."""
    return ShmTier(
        path, geometry, capacity_bytes, model_uid, settings.state_dir, fresh=fresh, sparse=sparse
    )


def disk_tier(
    settings: Settings,
    geometry: PoolGeometry,
    model_uid: str,
    *,
    path: Path | None = None,
    fresh: bool = False,
) -> DiskTier | None:
    """The disk tier (at ``path``, default :func:`disk_path`), or None when it is off."""
    capacity = int(settings.tiers.disk.capacity)
    if not capacity:
        return None
    where = path or disk_path(settings)
    return DiskTier(where, geometry, capacity, model_uid, settings.state_dir, fresh=fresh)


def build_tiers(settings: Settings, geometry: PoolGeometry, model_uid: str) -> list[HostTier]:
    """The enabled tiers, in the order a pause with tier=auto tries them.

    Built in order; if one fails, those already built are closed before the error goes on.
    """
    cfg = settings.tiers
    tiers: list[HostTier] = []
    try:
        if cfg.dram.capacity:
            tiers.append(DramTier(geometry, int(cfg.dram.capacity)))
        if cfg.shm.capacity:
            path = cfg.shm.path or default_shm_path(settings.state_dir)
            tiers.append(shm_tier(settings, path, geometry, int(cfg.shm.capacity), model_uid))
        disk = disk_tier(settings, geometry, model_uid)
        if disk is not None:
            tiers.append(disk)
    except BaseException:
        for tier in tiers:
            tier.close()
        raise
    return tiers
