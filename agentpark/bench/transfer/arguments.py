"""Which ``agentpark bench transfer`` arguments cannot be measured, and why (the bench
then exits 2 with that message, before anything is built)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from agentpark.bench.common import MEMORY_FILESYSTEMS, GiB, KiB, MiB, filesystem_of, human
from agentpark.bench.transfer.geometry import TOKEN_BYTES
from agentpark.dma import select_transfer
from agentpark.dma.host_copy import MAX_COPY_THREADS
from agentpark.errors import ConfigError

__all__ = ["BACKENDS", "SHM_ROOT", "TIERS", "default_parent", "problem"]

TIERS = ("dram", "shm", "disk")
BACKENDS = ("host_copy", "jax_memkind", "tpu_sync")
SHM_ROOT = Path("/dev/shm")


def problem(
    sizes: Sequence[int],
    repeats: int,
    tier: str,
    directory: Path | None,
    copy_threads: int,
    backend: str,
    hash_thread: bool,
) -> str | None:
    """Why these arguments cannot be measured, or None (see ``run_transfer_bench``)."""
    found = _argument_problem(sizes, repeats, tier, directory)
    if found is None and not 1 <= copy_threads <= MAX_COPY_THREADS:
        found = f"--copy-threads must be 1..{MAX_COPY_THREADS}, got {copy_threads}"
    if found is None and backend not in BACKENDS:
        found = f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}"
    if found is None and backend != "host_copy":
        found = _backend_problem(backend, tier, copy_threads, hash_thread)
    return found


def _backend_problem(backend: str, tier: str, copy_threads: int, hash_thread: bool) -> str | None:
    """Why ``backend`` (tpu_sync or jax_memkind) cannot be benched with these flags."""
    if tier != "dram":
        where = "TPU Sync's host memory" if backend == "tpu_sync" else "a dram tier"
        return f"--backend {backend} parks into {where}: --tier dram only"
    if copy_threads != 1:
        workers = "TPU Sync's own workers" if backend == "tpu_sync" else "jax.device_put"
        return (
            f"--copy-threads is host_copy's dma.copy_threads; --backend {backend} copies with "
            f"{workers}: leave it at 1, got {copy_threads}"
        )
    if hash_thread:
        return f"--hash-thread is host_copy's dma.hash_thread; --backend {backend} has no checksum"
    if backend == "jax_memkind":
        try:
            select_transfer("jax_memkind")
        except ConfigError as exc:
            return f"--backend jax_memkind: {exc.message}"
    return None


def _argument_problem(
    sizes: Sequence[int], repeats: int, tier: str, directory: Path | None
) -> str | None:
    if tier not in TIERS:
        return f"--tier must be one of {', '.join(TIERS)}, got {tier!r}"
    if repeats < 1:
        return f"--repeats must be >= 1, got {repeats}"
    bad = [s for s in sizes if s <= 0 or s % TOKEN_BYTES]
    if not sizes or bad:
        return (
            f"each size must be a positive multiple of {TOKEN_BYTES // KiB} KiB "
            f"(the KV of one token); got {', '.join(map(human, bad)) or 'none'}"
        )
    if tier == "dram":
        return None if directory is None else "--dir is for the shm and disk tiers only"
    parent = directory if directory is not None else default_parent(tier)
    assert parent is not None
    if not parent.is_dir():
        return f"--dir {parent} is not a directory"
    mount = filesystem_of(parent)
    if tier == "disk" and mount is not None and mount[1] in MEMORY_FILESYSTEMS:
        return (
            f"{parent} is on {mount[1]} ({mount[0]}), which is memory, not a disk: "
            "pass --dir on a disk-backed filesystem"
        )
    # The tier file, plus (disk) the plain reference file; a margin for the headers.
    need = max(sizes) * (2 if tier == "disk" else 1) + 64 * MiB
    st = os.statvfs(parent)
    if st.f_bavail * st.f_frsize < need:
        return (
            f"{parent} has {human(st.f_bavail * st.f_frsize)} free; "
            f"the {tier} bench needs about {need / GiB:.1f} GiB there"
        )
    return None


def default_parent(tier: str) -> Path | None:
    if tier == "shm":
        return SHM_ROOT
    if tier == "disk":
        return Path.cwd()
    return None
