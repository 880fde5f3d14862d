"""tpu_sync: Google's TPU Sync moves blocks between HBM and its own pinned host memory.

TPU Sync (PyPI ``tpu-sync-jax``, the optional extra ``agentpark[tpu]``; Python >= 3.12, TPU
hosts) is driven through ``tpu_sync.api.jax.kv_cache_manager.KVCacheManager``::

    KVCacheManager(kv_caches, local_control_port, host_blocks_to_allocate=N,
                   unsafe_skip_buffer_lock=True, parallelism=4, ...)
    manager.d2h(src_offsets, dst_offsets, copy_sizes) -> future    # HBM -> host blocks
    manager.h2d(src_offsets, dst_offsets, copy_sizes) -> future    # host blocks -> HBM
    future.wait()   # blocks; raises RuntimeError("Async copy failed: ...") on failure

Offsets and ``copy_sizes`` count whole blocks along axis 0 (the "major dim") of every array
in ``kv_caches`` at once: ``copy_sizes[i]`` contiguous blocks go from ``src_offsets[i]`` to
``dst_offsets[i]``. A pause or restore is ONE call per direction, with every run where both
the pool block ids and the tier slots are consecutive merged into one offset pair and one
size. TPU Sync has no pause/resume notion: that is agentpark's layer.

Who holds the bytes (how the tier and this backend cooperate):

* TPU Sync allocates its host pool itself (``host_blocks_to_allocate``, pinned and
  registered with the TPU's DMA engine) and keeps the blocks there in the TPU's tiled layout,
  not row-major numpy. Those bytes are only ever given back to TPU Sync.
* Tier slot ``s`` IS TPU Sync host block ``s``; ``host_blocks`` is the tier's capacity in
  blocks. The tier keeps doing what it always does for slots (free list, ownership, capacity,
  TierFullError); TPU Sync's own allocator (``d2h_auto_allocate``) is never used.
* So the tier must be slot bookkeeping only: this backend never calls ``tier.buffers()``, and
  the tier should not preallocate numpy buffers (they would never hold a byte).
  :attr:`TpuSyncTransfer.bytes_in_tier` is ``False`` to say so: whoever wires the daemon
  builds a slot-only tier for it, and nothing may read, checksum or demote (to shm/disk) the
  parked bytes through the tier. A parked copy here does not survive a daemon restart
  (TPU Sync's /dev/shm warm boot is not used: its segments are world-writable).
* One transfer serves one tier and one engine, both fixed at the first copy; a different one
  is refused, since its slots would alias the same host blocks.

The KVCacheManager holds the device buffers it was built over and copies to and from that
memory. The engine must therefore update its pool in place (donated, aliased); every copy
first checks, under ``engine.lock``, that the pool arrays still sit at the device addresses
they had when TPU Sync was bound, and refuses with TransferError otherwise. It also waits for
pending work on the pool (``block_until_ready``) before the DMA starts, because TPU Sync reads
and writes the memory behind XLA's back.

``tpu_sync`` is imported lazily, only when this backend is built with its default manager
factory; tests inject a stand-in through ``manager_factory``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Protocol, cast

import jax

from agentpark.blocks import check_copy, paired_runs
from agentpark.engine.base import EngineAdapter
from agentpark.errors import TransferError
from agentpark.tiers.base import HostTier

__all__ = [
    "INSTALL_HINT",
    "KVCacheManagerLike",
    "ManagerFactory",
    "TpuSyncTransfer",
    "TransferFuture",
    "default_manager_factory",
]

INSTALL_HINT = "install agentpark[tpu] (Python >= 3.12, TPU hosts)"
SHM_ENV = "RAIDEN_SHM_KEY"


class TransferFuture(Protocol):
    def wait(self) -> None:
        """Block until the copy is done; raise RuntimeError if it failed."""
        ...


class KVCacheManagerLike(Protocol):
    """The part of ``tpu_sync.api.jax.kv_cache_manager.KVCacheManager`` this backend uses."""

    def d2h(
        self, src_offsets: list[int], dst_offsets: list[int], copy_sizes: list[int] | None = None
    ) -> TransferFuture: ...

    def h2d(
        self, src_offsets: list[int], dst_offsets: list[int], copy_sizes: list[int] | None = None
    ) -> TransferFuture: ...


ManagerFactory = Callable[[list[jax.Array], int], KVCacheManagerLike]
"""``(kv_caches, host_blocks) -> manager``: builds the manager over the pool arrays."""


def default_manager_factory(local_control_port: int = 0, parallelism: int = 4) -> ManagerFactory:
    """Build real TPU Sync managers (imports ``tpu_sync`` only when one is built).

    ``local_control_port=0`` starts no control server (TPU Sync passes ``None`` on for it);
    ``unsafe_skip_buffer_lock=True`` is TPU Sync's own default: the engine lock, not a
    per-copy buffer hold, keeps the pool from being used while a copy runs.
    """

    def build(kv_caches: list[jax.Array], host_blocks: int) -> KVCacheManagerLike:
        if os.environ.get(SHM_ENV):
            raise TransferError(
                f"{SHM_ENV} is set: TPU Sync would keep parked KV in world-writable /dev/shm "
                "segments; unset it (agentpark's shm tier is the persistent one)"
            )
        from tpu_sync.api.jax.kv_cache_manager import KVCacheManager

        manager = KVCacheManager(
            kv_caches=kv_caches,
            local_control_port=local_control_port,
            host_blocks_to_allocate=host_blocks,
            unsafe_skip_buffer_lock=True,
            parallelism=parallelism,
        )
        return cast(KVCacheManagerLike, manager)

    return build


def _device_pointers(arrays: Sequence[jax.Array]) -> tuple[int, ...]:
    return tuple(
        shard.data.unsafe_buffer_pointer() for arr in arrays for shard in arr.addressable_shards
    )


class TpuSyncTransfer:
    """Pauses and restores through one TPU Sync KVCacheManager over the engine's pool."""

    name = "tpu_sync"
    bytes_in_tier = False
    """The parked bytes live in TPU Sync's host memory; the tier only keeps slot bookkeeping."""

    def __init__(
        self,
        engine: EngineAdapter,
        host_blocks: int,
        *,
        manager_factory: ManagerFactory | None = None,
        local_control_port: int = 0,
        parallelism: int = 4,
    ) -> None:
        if host_blocks <= 0:
            raise ValueError(f"host_blocks must be positive, got {host_blocks}")
        self.engine = engine
        self.host_blocks = host_blocks
        self._factory = manager_factory or default_manager_factory(local_control_port, parallelism)
        self._manager: KVCacheManagerLike | None = None
        self._pointers: tuple[int, ...] = ()
        self._tier: HostTier | None = None

    @property
    def bound(self) -> bool:
        """Whether the KVCacheManager has been built."""
        return self._manager is not None

    def start(self) -> None:
        """Build the KVCacheManager now (it allocates and pins ``host_blocks`` host blocks).

        Idempotent. Copies call it too, so a daemon that skips it binds on the first pause.
        Raises TransferError if the pool does not suit TPU Sync or the manager cannot be built.
        """
        with self.engine.lock:
            self._bound_manager()

    def d2h(
        self,
        engine: EngineAdapter,
        block_ids: Sequence[int],
        tier: HostTier,
        slots: Sequence[int],
        digest: bool = False,
    ) -> str | None:
        """Unfused: returns None, and the mover hashes the tier after the copy."""
        self._check(engine, block_ids, tier, slots)
        if not block_ids:
            return None
        src, dst, sizes = paired_runs(block_ids, slots)
        with engine.lock:
            manager = self._bound_manager()
            self._run("pause (d2h)", manager.d2h, src, dst, sizes)
        return None

    def h2d(
        self,
        tier: HostTier,
        slots: Sequence[int],
        engine: EngineAdapter,
        block_ids: Sequence[int],
        digest: bool = False,
    ) -> str | None:
        """Unfused: returns None, and the mover verifies the tier before the copy."""
        self._check(engine, block_ids, tier, slots)
        if not block_ids:
            return None
        src, dst, sizes = paired_runs(slots, block_ids)
        with engine.lock:
            manager = self._bound_manager()
            self._run("restore (h2d)", manager.h2d, src, dst, sizes)
        return None

    # -- internals ----------------------------------------------------------------------------

    def _check(
        self,
        engine: EngineAdapter,
        block_ids: Sequence[int],
        tier: HostTier,
        slots: Sequence[int],
    ) -> None:
        check_copy(block_ids, engine.geometry.num_blocks, slots, self.host_blocks)
        if engine is not self.engine:
            raise ValueError("this tpu_sync transfer is bound to another engine")
        if self._tier is None:
            if tier.capacity_blocks > self.host_blocks:
                raise ValueError(
                    f"the {tier.name} tier has {tier.capacity_blocks} slots but TPU Sync holds "
                    f"{self.host_blocks} host blocks; build it with host_blocks >= capacity"
                )
            self._tier = tier
        elif tier is not self._tier:
            raise ValueError(
                f"this tpu_sync transfer holds the bytes of the {self._tier.name} tier; the "
                f"{tier.name} tier's slots would alias the same TPU Sync host blocks"
            )

    def _bound_manager(self) -> KVCacheManagerLike:
        """The manager, built on first use; the pool must not have moved since. Hold the lock."""
        arrays = list(self.engine.kv_pool())
        try:
            jax.block_until_ready(arrays)  # type: ignore[no-untyped-call]
            pointers = _device_pointers(arrays)
        except Exception as exc:
            raise TransferError(f"the engine's pool is not usable: {exc}") from exc
        if self._manager is None:
            for arr in arrays:
                if arr.sharding.shard_shape(arr.shape)[0] != arr.shape[0]:
                    raise TransferError(
                        f"TPU Sync needs the pool's block axis unsharded, got {arr.sharding}"
                    )
            try:
                manager = self._factory(arrays, self.host_blocks)
            except TransferError:
                raise
            except Exception as exc:
                raise TransferError(f"cannot start TPU Sync's KVCacheManager: {exc}") from exc
            self._manager, self._pointers = manager, pointers
            return manager
        if pointers != self._pointers:
            raise TransferError(
                "the engine's pool arrays moved in device memory since TPU Sync was bound to "
                "them; TPU Sync copies to and from the memory it was given, so the copy is "
                "refused (the engine must update its pool in place, donated)"
            )
        return self._manager

    @staticmethod
    def _run(
        what: str,
        call: Callable[[list[int], list[int], list[int]], TransferFuture],
        src: list[int],
        dst: list[int],
        sizes: list[int],
    ) -> None:
        try:
            future = call(src, dst, sizes)
            future.wait()
        except Exception as exc:
            raise TransferError(
                f"TPU Sync {what} of {sum(sizes)} blocks in {len(sizes)} runs failed: {exc}"
            ) from exc
