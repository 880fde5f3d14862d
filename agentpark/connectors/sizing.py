"""How big the vLLM host pool is by default, and how long ``register`` may take.

Both sides read this one module, so the worker's wait is derived from the same figures
the daemon sizes the pool by. Light: no vLLM, torch or daemon imports (the worker loads it).

**The pool size rule** (``[vllm] pool_capacity`` unset): ``POOL_PER_KV`` (4) times the
engine's own KV cache (``num_blocks`` x the bytes of one block over every array, as the
worker registers it), at most ``MEM_SHARE`` (half) of the host's ``MemAvailable`` when the
pool is made, and never below ``POOL_FLOOR`` (64 MiB). Four KV caches' worth lets the
sessions parked during tool calls outnumber those vLLM holds; half of what is free leaves
the engine and the rest of the host their memory (the file is sparse: the pages are only
taken as sessions park). A ``pool_capacity`` set in the config is used as it is.

**The register wait**: the daemon makes (or re-attaches) the pool file, verifies its
header and, with a disk tier, makes that file too, all before it answers. The pool file is
sparse (``ftruncate``), so that costs milliseconds; the wait still grows with the pool a
slow filesystem might have to reserve: ``REGISTER_BASE_S`` (30 s) plus
``REGISTER_PER_GIB_S`` (2 s) per GiB of the pool the rule gives for the layout.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = [
    "MEM_SHARE",
    "POOL_FLOOR",
    "POOL_PER_KV",
    "REGISTER_BASE_S",
    "REGISTER_PER_GIB_S",
    "default_pool_bytes",
    "kv_cache_bytes",
    "mem_available",
    "register_wait_s",
    "sized_pool",
]

POOL_PER_KV = 4
MEM_SHARE = 0.5
POOL_FLOOR = 64 << 20
REGISTER_BASE_S = 30.0
REGISTER_PER_GIB_S = 2.0

_ITEM_BYTES = {"uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "float16": 2, "uint32": 4}
_ITEM_BYTES.update({"int32": 4, "float32": 4, "uint64": 8, "int64": 8, "float64": 8})


def kv_cache_bytes(num_blocks: int, arrays: Iterable[tuple[Sequence[int], str]]) -> int:
    """The engine's KV cache as registered: ``num_blocks`` blocks of every array."""
    per_block = sum(math.prod(shape) * _ITEM_BYTES.get(dtype, 2) for shape, dtype in arrays)
    return int(num_blocks) * per_block


def mem_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """``MemAvailable`` in bytes, or None where the kernel does not say."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_pool_bytes(kv_bytes: int, available: int | None) -> int:
    """The pool for a KV cache of ``kv_bytes`` on a host with ``available`` bytes free."""
    want = POOL_PER_KV * kv_bytes
    if available is not None:
        want = min(want, int(available * MEM_SHARE))
    return max(want, POOL_FLOOR)


def sized_pool(kv_bytes: int) -> tuple[int, str]:
    """The rule's pool for a KV cache of ``kv_bytes`` on this host now, and its reason."""
    available = mem_available()
    size = default_pool_bytes(kv_bytes, available)
    free = "unknown" if available is None else f"{available >> 20} MiB"
    return size, (
        f"{size >> 20} MiB = {POOL_PER_KV}x the engine's KV cache ({kv_bytes >> 20} MiB), at "
        f"most {MEM_SHARE:.0%} of MemAvailable ({free}), at least {POOL_FLOOR >> 20} MiB"
    )


def register_wait_s(kv_bytes: int) -> float:
    """How long the worker waits for ``register``'s answer (module docstring)."""
    pool = POOL_PER_KV * kv_bytes
    return REGISTER_BASE_S + REGISTER_PER_GIB_S * pool / (1 << 30)
