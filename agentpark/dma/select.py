"""select_transfer: the ``dma.backend`` setting turned into a backend, checked at start.

Why its own module: the factory knows every backend and the platform checks each needs
(JAX's platform, its memory kinds, TPU Sync's wheel and environment); the backends know
none of that, and agentpark.dma only names what the package offers.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import jax

from agentpark.dma.base import Transfer
from agentpark.dma.host_copy import HostCopyTransfer
from agentpark.dma.jax_memkind import JaxMemkindTransfer
from agentpark.dma.tpu_sync import INSTALL_HINT, SHM_ENV, TpuSyncShm, TpuSyncTransfer
from agentpark.engine.base import EngineAdapter
from agentpark.errors import ConfigError, TransferError

__all__ = ["BACKENDS", "bytes_in_tier", "select_transfer"]

BACKENDS = ("auto", "host_copy", "jax_memkind", "tpu_sync")
"""The values ``dma.backend`` accepts."""

_MEMORY_KINDS = ("device", "pinned_host")


def bytes_in_tier(transfer: Transfer) -> bool:
    """True when parked bytes sit in the tier's buffers (row-major, the pool's layout).

    False for tpu_sync: the tier is then slot bookkeeping only, and its bytes can be neither
    read, checksummed nor moved to another tier by agentpark.
    """
    return bool(getattr(transfer, "bytes_in_tier", True))


def select_transfer(
    backend: str,
    *,
    engine: EngineAdapter | None = None,
    host_blocks: int | None = None,
    tpu_sync_on_cpu: bool = False,
    tpu_sync_shm: TpuSyncShm | None = None,
    copy_threads: int = 1,
    hash_thread: bool = False,
    native_copy: bool = True,
) -> Transfer:
    """The backend ``dma.backend`` names, checked against this platform and installation.

    ``auto`` picks host_copy on the CPU platform (the pool lives in host memory) and
    jax_memkind on a GPU or TPU. ``tpu_sync`` also needs ``engine`` and ``host_blocks`` (the
    capacity in blocks of the one tier whose bytes TPU Sync will hold); its KVCacheManager is
    built here, so a TPU Sync that cannot start stops the daemon at start. TPU Sync's wheel
    also runs on JAX's CPU platform; ``tpu_sync_on_cpu`` (``dma.tpu_sync_on_cpu``) allows that,
    for tests and the bench: it moves bytes, but says nothing about a TPU's DMA engine.
    ``tpu_sync_shm`` turns on TPU Sync's own /dev/shm warm boot, checked by agentpark.
    ``copy_threads`` (``dma.copy_threads``), ``hash_thread`` (``dma.hash_thread``) and
    ``native_copy`` (``dma.native_copy``) are host_copy's; the other backends ignore them.
    """
    platform = jax.default_backend()
    if backend == "auto":
        backend = "host_copy" if platform == "cpu" else "jax_memkind"
        label = f"'auto' (which picks {backend!r} on JAX platform {platform!r})"
    else:
        label = repr(backend)
    if backend == "host_copy":
        if platform != "cpu":
            raise _refuse(
                label,
                f"host_copy needs the pool in host memory, but JAX's platform is {platform!r}; "
                "use 'jax_memkind' (or 'tpu_sync' on TPU hosts)",
            )
        return HostCopyTransfer(
            copy_threads=copy_threads, hash_thread=hash_thread, native_copy=native_copy
        )
    if backend == "jax_memkind":
        missing = [kind for kind in _MEMORY_KINDS if kind not in _memory_kinds()]
        if missing:
            raise _refuse(
                label,
                f"JAX's {platform!r} device has no {' or '.join(map(repr, missing))} memory "
                f"kind (it has {sorted(_memory_kinds())})",
            )
        return JaxMemkindTransfer()
    if backend == "tpu_sync":
        problems = _tpu_sync_problems(platform, on_cpu=tpu_sync_on_cpu)
        if problems:
            raise _refuse(label, "; ".join(problems))
        if engine is None or host_blocks is None:
            raise ValueError("select_transfer('tpu_sync') needs engine= and host_blocks=")
        transfer = TpuSyncTransfer(engine, host_blocks, shm=tpu_sync_shm)
        try:
            transfer.start()
        except TransferError as exc:
            raise _refuse(label, exc.message) from exc
        return transfer
    allowed = ", ".join(BACKENDS)
    raise ConfigError(f"dma.backend = {backend!r} is not supported (allowed: {allowed})")


def _refuse(label: str, why: str) -> ConfigError:
    return ConfigError(f"dma.backend = {label} cannot be used here: {why}")


def _memory_kinds() -> set[str]:
    """Memory kinds of JAX's first device (device, pinned_host, unpinned_host on CPU)."""
    return {memory.kind for memory in jax.devices()[0].addressable_memories()}


def _tpu_sync_problems(platform: str, *, on_cpu: bool = False) -> list[str]:
    """Why tpu_sync cannot run here (empty when it can); ``on_cpu`` also allows JAX's CPU."""
    problems: list[str] = []
    missing = _tpu_sync_install_problem()
    if missing:
        problems.append(missing)
    if platform == "cpu" and not on_cpu:
        problems.append(
            "JAX's platform is 'cpu', and TPU Sync needs a TPU (its wheel runs on the CPU "
            "too: set dma.tpu_sync_on_cpu = true to use it there, for tests and the bench)"
        )
    elif platform not in ("tpu", "cpu"):
        problems.append(f"JAX's platform is {platform!r}, and TPU Sync needs a TPU")
    if os.environ.get(SHM_ENV):
        problems.append(
            f"{SHM_ENV} is set: TPU Sync would keep parked KV in /dev/shm segments agentpark "
            "did not make (created with the umask: world-readable under 022); unset it "
            "(dma.tpu_sync_shm is the checked way to warm boot)"
        )
    return problems


def _tpu_sync_install_problem() -> str | None:
    """None when TPU Sync's JAX API imports; else why not. Imports tpu_sync only if present."""
    if importlib.util.find_spec("tpu_sync") is None:
        version = ".".join(map(str, sys.version_info[:2]))
        old = f"; this is Python {version}" if sys.version_info < (3, 12) else ""
        return f"the tpu_sync package is not installed: {INSTALL_HINT}{old}"
    try:
        importlib.import_module("tpu_sync.api.jax.kv_cache_manager")
    except Exception as exc:
        return f"the tpu_sync package does not import ({exc}): {INSTALL_HINT}"
    return None
