"""TPU Sync's KVCacheManager over a list of KV arrays: build it once, copy in merged runs.

Shared by the daemon's tpu_sync backend (agentpark.dma.tpu_sync, over its engine's pool)
and the connector's TPU worker (agentpark.connectors.tpu, over tpu-inference's runner):
the facts about TPU Sync that both rely on are in agentpark.dma.tpu_sync's docstring.
Here only what does not depend on who owns the arrays: the manager's shape (a protocol),
the default factory that builds the real one, its build (block axis unsharded, TPU Sync's
shm mode wrapped by :class:`~agentpark.connectors.tpu_sync_shm.TpuSyncShm`), the checks
before a copy and the copy itself (one call per direction, every consecutive run merged).

Light for the connector: JAX and this package's tpu_sync_shm only; ``tpu_sync`` is
imported when the default factory builds a manager.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import jax

from agentpark.blocks import PoolGeometry, check_copy, paired_runs
from agentpark.connectors.tpu_sync_shm import SHM_ENV, TpuSyncShm
from agentpark.errors import TransferError

__all__ = [
    "KVCacheManagerLike",
    "ManagerFactory",
    "TransferFuture",
    "build_manager",
    "check_distinct",
    "check_pairs",
    "default_manager_factory",
    "device_pointers",
    "run_copy",
]

log = logging.getLogger(__name__)


class TransferFuture(Protocol):
    def wait(self) -> None:
        """Block until the copy is done; raise RuntimeError if it failed."""
        ...


class KVCacheManagerLike(Protocol):
    """The part of ``tpu_sync.api.jax.kv_cache_manager.KVCacheManager`` agentpark uses."""

    def d2h(
        self, src_offsets: list[int], dst_offsets: list[int], copy_sizes: list[int] | None = None
    ) -> TransferFuture: ...

    def h2d(
        self, src_offsets: list[int], dst_offsets: list[int], copy_sizes: list[int] | None = None
    ) -> TransferFuture: ...


ManagerFactory = Callable[[list[jax.Array], int], KVCacheManagerLike]
"""``(kv_caches, host_blocks) -> manager``: builds the manager over the pool arrays."""


def default_manager_factory(
    local_control_port: int = 0, parallelism: int = 4, *, enable_shm: bool = False
) -> ManagerFactory:
    """Build real TPU Sync managers (imports ``tpu_sync`` only when one is built).

    ``local_control_port=0`` starts no control server (TPU Sync passes ``None`` on for it;
    its transport listener opens anyway, see agentpark.dma.tpu_sync);
    ``unsafe_skip_buffer_lock=True`` is TPU Sync's own default: the owner's lock, not a
    per-copy buffer hold, keeps the arrays from being used while a copy runs.
    ``enable_shm`` is only ever set with a :class:`TpuSyncShm`, which sets
    ``RAIDEN_SHM_KEY`` and the umask around the build (:func:`build_manager`).
    """

    def build(kv_caches: list[jax.Array], host_blocks: int) -> KVCacheManagerLike:
        if not enable_shm and os.environ.get(SHM_ENV):
            raise TransferError(
                f"{SHM_ENV} is set: TPU Sync would put parked KV in /dev/shm segments "
                "agentpark did not make (created with the umask: world-readable under 022); "
                "unset it (dma.tpu_sync_shm is the checked way to warm boot)"
            )
        from tpu_sync.api.jax.kv_cache_manager import KVCacheManager

        manager = KVCacheManager(
            kv_caches=kv_caches,
            local_control_port=local_control_port,
            host_blocks_to_allocate=host_blocks,
            unsafe_skip_buffer_lock=True,
            parallelism=parallelism,
            enable_shm=enable_shm,
        )
        return cast(KVCacheManagerLike, manager)

    return build


def device_pointers(arrays: Sequence[jax.Array]) -> tuple[int, ...]:
    """Where the arrays' shards sit in device memory (TPU Sync copies to and from there)."""
    return tuple(
        shard.data.unsafe_buffer_pointer() for arr in arrays for shard in arr.addressable_shards
    )


def build_manager(
    factory: ManagerFactory,
    arrays: list[jax.Array],
    host_blocks: int,
    *,
    shm: TpuSyncShm | None = None,
    geometry: PoolGeometry | None = None,
    model_uid: str = "",
) -> KVCacheManagerLike:
    """A manager over ``arrays``; with ``shm`` its segments checked against the layout.

    ``geometry`` and ``model_uid`` name the layout TPU Sync's shm segments are kept for
    (needed with ``shm``). TransferError for arrays TPU Sync cannot copy or a failed build.
    """
    for arr in arrays:
        if arr.sharding.shard_shape(arr.shape)[0] != arr.shape[0]:
            raise TransferError(
                f"TPU Sync needs the pool's block axis unsharded, got {arr.sharding}"
            )
    try:
        if shm is None:
            manager = factory(arrays, host_blocks)
        else:
            if geometry is None:
                raise ValueError("TPU Sync's shm mode needs the pool's geometry")
            layout: dict[str, Any] = shm.layout(geometry, model_uid, host_blocks)
            shm.prepare(layout)
            with shm.building():
                manager = factory(arrays, host_blocks)
            shm.commit(layout)
    except TransferError:
        raise
    except Exception as exc:
        raise TransferError(f"cannot start TPU Sync's KVCacheManager: {exc}") from exc
    endpoints = getattr(manager, "get_local_endpoints", None)
    log.warning(
        "tpu_sync: KVCacheManager over %d pool arrays, %d host blocks%s; it listens "
        "for transport on the wildcard address (%s), which agentpark cannot narrow and "
        "never uses",
        len(arrays),
        host_blocks,
        f", shm key {shm.key!r}" if shm else "",
        endpoints() if callable(endpoints) else "endpoint unknown",
    )
    return manager


def check_distinct(block_ids: Sequence[int], slots: Sequence[int]) -> None:
    """ValueError for a repeated id: two of TPU Sync's parallel streams would write one block."""
    for what, ids in (("block ids", block_ids), ("tier slots", slots)):
        if len(set(ids)) != len(ids):
            repeated = sorted({i for i in ids if list(ids).count(i) > 1})
            raise ValueError(f"duplicate {what} {repeated[:8]} in one copy")


def check_pairs(
    block_ids: Sequence[int], num_blocks: int, slots: Sequence[int], host_blocks: int
) -> None:
    """ValueError before any TPU Sync call for a copy it would refuse or run wrong."""
    check_copy(block_ids, num_blocks, slots, host_blocks)
    check_distinct(block_ids, slots)


def run_copy(
    what: str,
    call: Callable[[list[int], list[int], list[int]], TransferFuture],
    src: Sequence[int],
    dst: Sequence[int],
) -> None:
    """``src[i] -> dst[i]`` in one TPU Sync call, consecutive runs merged; waits for it."""
    offsets_src, offsets_dst, sizes = paired_runs(src, dst)
    try:
        future = call(offsets_src, offsets_dst, sizes)
        future.wait()
    except Exception as exc:
        raise TransferError(
            f"TPU Sync {what} of {sum(sizes)} blocks in {len(sizes)} runs failed: {exc}"
        ) from exc
