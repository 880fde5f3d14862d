"""tpu_sync: Google's TPU Sync moves blocks between HBM and its own host memory.

TPU Sync (PyPI ``tpu-sync-jax``, the optional extra ``agentpark[tpu]``; Python >= 3.12, TPU
hosts; its wheel also runs on JAX's CPU platform) is driven through
``tpu_sync.api.jax.kv_cache_manager.KVCacheManager``::

    KVCacheManager(kv_caches, local_control_port, host_blocks_to_allocate=N,
                   unsafe_skip_buffer_lock=True, parallelism=4, enable_shm=False, ...)
    manager.d2h(src_offsets, dst_offsets, copy_sizes) -> future    # pool -> host blocks
    manager.h2d(src_offsets, dst_offsets, copy_sizes) -> future    # host blocks -> pool
    future.wait()   # blocks; future.is_ready() polls

Facts checked against the real wheel (0.0.1rc20261023185136, on CPU):

* ``kv_caches`` must be ``jax.Array``s (a numpy array fails with AttributeError on
  ``addressable_shards``). h2d writes into those arrays' memory in place.
* Offsets and ``copy_sizes`` count whole blocks along axis 0 of every array at once:
  ``copy_sizes[i]`` contiguous blocks go from ``src_offsets[i]`` to ``dst_offsets[i]``. A
  pause or restore is ONE call per direction, with every run where both the pool block ids
  and the tier slots are consecutive merged into one offset pair and one size.
* Bad arguments (a negative offset, a range past either buffer, lists of different lengths)
  make the CALL raise RuntimeError (``absl::StatusOr not ok: INVALID_ARGUMENT: ...``), not
  ``wait()``; a size of 0 is accepted and copies nothing. agentpark checks every offset
  itself first (:func:`agentpark.blocks.check_copy`) and raises ValueError before any call.
* ``local_control_port=0`` starts no control server, but the manager always opens a TCP
  transport listener on an ephemeral port of the WILDCARD address (``*``, IPv4 and IPv6;
  its endpoint names the host's IP). Neither the Python API nor any environment variable
  found in the binary (``TPU_RAIDEN_DATA_NICS=lo``, ``TPU_RAIDEN_ENABLE_SOURCE_IP_BIND=1``
  were tried) moves it to loopback. agentpark never sends it traffic; firewall that port
  range on hosts that need it closed. :meth:`TpuSyncTransfer.start` logs the endpoint.

TPU Sync has no pause/resume notion: that is agentpark's layer.

Who holds the bytes (how the tier and this backend cooperate):

* TPU Sync allocates its host pool itself (``host_blocks_to_allocate``; pinned and
  registered with the TPU's DMA engine on a TPU) and keeps the blocks there in the TPU's
  tiled layout, not row-major numpy. Those bytes are only ever given back to TPU Sync.
* Tier slot ``s`` IS TPU Sync host block ``s``; ``host_blocks`` is the tier's capacity in
  blocks. The tier keeps doing what it always does for slots (free list, ownership, capacity,
  TierFullError); TPU Sync's own allocator (``d2h_auto_allocate``) is never used.
* So the tier is slot bookkeeping only (:class:`agentpark.tiers.base.BackendHeldTier`): this
  backend never calls ``tier.buffers()``, and nothing may read, checksum or demote the
  parked bytes through the tier (:attr:`TpuSyncTransfer.bytes_in_tier` is ``False``).
* One transfer serves one tier and one engine, both fixed at the first copy; a different one
  is refused, since its slots would alias the same host blocks.

Warm boot (surviving kill -9) goes through TPU Sync's own shm mode, hardened by
agentpark.dma.tpu_sync_shm (see there).

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

import logging
from collections.abc import Sequence

import jax

from agentpark.blocks import check_copy
from agentpark.connectors.tpu_sync_manager import (
    KVCacheManagerLike,
    ManagerFactory,
    TransferFuture,
    build_manager,
    check_distinct,
    default_manager_factory,
    device_pointers,
    run_copy,
)
from agentpark.connectors.tpu_sync_shm import SHM_ENV, TpuSyncShm
from agentpark.engine.base import EngineAdapter
from agentpark.errors import TransferError
from agentpark.tiers.base import HostTier

__all__ = [
    "INSTALL_HINT",
    "SHM_ENV",
    "KVCacheManagerLike",
    "ManagerFactory",
    "TpuSyncShm",
    "TpuSyncTransfer",
    "TransferFuture",
    "default_manager_factory",
]

log = logging.getLogger(__name__)

INSTALL_HINT = "install agentpark[tpu] (Python >= 3.12, TPU hosts)"


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
        shm: TpuSyncShm | None = None,
    ) -> None:
        if host_blocks <= 0:
            raise ValueError(f"host_blocks must be positive, got {host_blocks}")
        self.engine = engine
        self.host_blocks = host_blocks
        self.shm = shm
        """TPU Sync's own shm mode (warm boot) when set; its host memory dies with us when not."""
        self._factory = manager_factory or default_manager_factory(
            local_control_port, parallelism, enable_shm=shm is not None
        )
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
        with engine.lock:
            manager = self._bound_manager()
            run_copy("pause (d2h)", manager.d2h, block_ids, slots)
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
        with engine.lock:
            manager = self._bound_manager()
            run_copy("restore (h2d)", manager.h2d, slots, block_ids)
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
        check_distinct(block_ids, slots)
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
            pointers = device_pointers(arrays)
        except Exception as exc:
            raise TransferError(f"the engine's pool is not usable: {exc}") from exc
        if self._manager is None:
            manager = build_manager(
                self._factory,
                arrays,
                self.host_blocks,
                shm=self.shm,
                geometry=self.engine.geometry,
                model_uid=self.engine.model_uid,
            )
            self._manager, self._pointers = manager, pointers
            return manager
        if pointers != self._pointers:
            raise TransferError(
                "the engine's pool arrays moved in device memory since TPU Sync was bound to "
                "them; TPU Sync copies to and from the memory it was given, so the copy is "
                "refused (the engine must update its pool in place, donated)"
            )
        return self._manager
