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

Warm boot (surviving kill -9) goes through TPU Sync's OWN shm mode, hardened
(:class:`TpuSyncShm`), because agentpark's shm tier cannot hold these bytes: TPU Sync has no
API to read its host blocks, and on a TPU they are in its tiled layout. With
``enable_shm=True`` and ``RAIDEN_SHM_KEY=k`` it keeps its host blocks in ``/dev/shm/k_dev_<n>``
(+ ``.lock``), and a new process with the same key finds them again. Left alone that mode is
unsafe for agentpark, so :class:`TpuSyncShm`:

* chooses the key itself (from the state directory) and sets ``RAIDEN_SHM_KEY`` only while
  the manager is built; a ``RAIDEN_SHM_KEY`` set from outside is refused;
* builds under umask 077: TPU Sync creates the segments with the process umask (0644 under
  the usual 022, i.e. every local user could read every agent's context; 0666 under 000),
  then checks they are regular files of this uid with mode 0600, before and after;
* records the layout (model uid, pool arrays, host blocks, TPU Sync version) in a 0600
  file in the state directory and refuses to hand existing segments to TPU Sync unless it
  matches, because TPU Sync silently ZEROES segments whose layout differs (checked: a wider
  block, or more host blocks, read back zeros, and the original layout then reads zeros
  too). Refused segments are moved aside, never deleted, and the tier starts empty (its
  sessions become LOST and are recomputed), as agentpark's own shm tier does.

What this cannot give: a checksum of the parked bytes (agentpark cannot read them), so a
copy corrupted in /dev/shm by this uid is not detected.

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

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

import jax

from agentpark.blocks import PoolGeometry, check_copy, paired_runs
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
SHM_ENV = "RAIDEN_SHM_KEY"
SHM_ROOT = Path("/dev/shm")
SHM_RECORD = "tpu_sync-shm.json"
"""The layout record of TPU Sync's segments, in the state directory."""


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


def default_manager_factory(
    local_control_port: int = 0, parallelism: int = 4, *, enable_shm: bool = False
) -> ManagerFactory:
    """Build real TPU Sync managers (imports ``tpu_sync`` only when one is built).

    ``local_control_port=0`` starts no control server (TPU Sync passes ``None`` on for it;
    its transport listener opens anyway, see the module docstring);
    ``unsafe_skip_buffer_lock=True`` is TPU Sync's own default: the engine lock, not a
    per-copy buffer hold, keeps the pool from being used while a copy runs. ``enable_shm``
    is only ever set by :class:`TpuSyncTransfer` with a :class:`TpuSyncShm`, which sets
    ``RAIDEN_SHM_KEY`` and the umask around the build.
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


def tpu_sync_version() -> str:
    try:
        return importlib.metadata.version("tpu-sync-jax")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


class TpuSyncShm:
    """TPU Sync's /dev/shm warm boot, made safe enough for agentpark (module docstring).

    ``prepare()`` runs before the manager is built and decides whether existing segments
    may be handed to TPU Sync (``reattached``) or are moved aside (``attach_problem``);
    ``building()`` wraps the build (key in the environment, umask 077); ``commit()`` runs
    after it, checks the segments and writes the layout record.
    """

    def __init__(self, state_dir: Path, *, key: str | None = None, root: Path = SHM_ROOT):
        self.state_dir = Path(state_dir)
        digest = hashlib.sha256(str(self.state_dir.resolve()).encode()).hexdigest()[:16]
        self.key = key or f"agentpark-{digest}"
        self.root = Path(root)
        self.record_path = self.state_dir / SHM_RECORD
        self.reattached = False
        self.attach_problem: str | None = None

    def segments(self) -> list[Path]:
        """TPU Sync's files for this key (``<key>_dev_<n>`` and their ``.lock``)."""
        return sorted(self.root.glob(f"{self.key}_dev_*"))

    def layout(self, geometry: PoolGeometry, model_uid: str, host_blocks: int) -> dict[str, Any]:
        return {
            "format": 1,
            "key": self.key,
            "model_uid": model_uid,
            "block_size": geometry.block_size,
            "arrays": [[list(a.block_shape), str(a.dtype)] for a in geometry.arrays],
            "host_blocks": host_blocks,
            "tpu_sync": tpu_sync_version(),
        }

    def prepare(self, layout: dict[str, Any]) -> None:
        """Decide about existing segments BEFORE TPU Sync sees them (it zeroes mismatches)."""
        self.reattached, self.attach_problem = False, None
        existing = self.segments()
        if not existing:
            return
        problem = self._mismatch(existing, layout)
        if problem is None:
            self.reattached = True
            log.info("tpu_sync shm: re-attaching %s", ", ".join(map(str, existing)))
            return
        stamp = time.time_ns()
        for path in existing:
            path.rename(path.with_name(f"{path.name}.mismatch-{stamp}"))
        self.record_path.unlink(missing_ok=True)
        self.attach_problem = f"{existing[0]}: {problem}"
        log.error(
            "tpu_sync shm: refusing to attach %s: %s; moved aside (.mismatch-%d), starting empty",
            ", ".join(map(str, existing)),
            problem,
            stamp,
        )

    @contextlib.contextmanager
    def building(self) -> Iterator[None]:
        """The build's surroundings: ``RAIDEN_SHM_KEY`` = our key, umask 077 (process-wide)."""
        if os.environ.get(SHM_ENV):
            raise TransferError(
                f"{SHM_ENV} is set from outside: agentpark chooses TPU Sync's shm key itself "
                "(dma.tpu_sync_shm); unset it"
            )
        old_umask = os.umask(0o077)
        os.environ[SHM_ENV] = self.key
        try:
            yield
        finally:
            os.environ.pop(SHM_ENV, None)
            os.umask(old_umask)

    def commit(self, layout: dict[str, Any]) -> None:
        """After the build: the segments must exist and be ours; record their layout."""
        existing = [p for p in self.segments() if not p.name.endswith(".lock")]
        if not existing:
            raise TransferError(
                f"TPU Sync made no /dev/shm segment for key {self.key!r} with enable_shm"
            )
        for path in self.segments():
            problem = _not_private(path)
            if problem:
                raise TransferError(f"TPU Sync's segment {path} is {problem}")
        tmp = self.record_path.with_name(self.record_path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(layout, out, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.record_path)

    def _mismatch(self, existing: list[Path], layout: dict[str, Any]) -> str | None:
        for path in existing:
            problem = _not_private(path)
            if problem:
                return problem
        try:
            recorded = json.loads(self.record_path.read_text())
        except FileNotFoundError:
            return f"no layout record {self.record_path} (segments of unknown layout)"
        except (OSError, ValueError) as exc:
            return f"unreadable layout record {self.record_path}: {exc}"
        problem = _not_private(self.record_path)
        if problem:
            return f"layout record {problem}"
        for key, value in layout.items():
            if recorded.get(key) != value:
                return f"{key} is {recorded.get(key)!r}, this daemon has {value!r}"
        return None


def _not_private(path: Path) -> str | None:
    """Why ``path`` is not a regular file of this uid with mode 0600 (None when it is)."""
    st = path.lstat()
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not this daemon's uid {os.geteuid()}"
    if st.st_mode & 0o077:
        return f"mode {st.st_mode & 0o777:o}, not 0600"
    return None


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
        # A repeated id would make two of TPU Sync's parallel copy streams write one block.
        for what, ids in (("block ids", block_ids), ("tier slots", slots)):
            if len(set(ids)) != len(ids):
                repeated = sorted({i for i in ids if list(ids).count(i) > 1})
                raise ValueError(f"duplicate {what} {repeated[:8]} in one copy")
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
            manager = self._build(arrays)
            self._manager, self._pointers = manager, pointers
            endpoints = getattr(manager, "get_local_endpoints", None)
            log.warning(
                "tpu_sync: KVCacheManager over %d pool arrays, %d host blocks%s; it listens "
                "for transport on the wildcard address (%s), which agentpark cannot narrow and "
                "never uses",
                len(arrays),
                self.host_blocks,
                f", shm key {self.shm.key!r}" if self.shm else "",
                endpoints() if callable(endpoints) else "endpoint unknown",
            )
            return manager
        if pointers != self._pointers:
            raise TransferError(
                "the engine's pool arrays moved in device memory since TPU Sync was bound to "
                "them; TPU Sync copies to and from the memory it was given, so the copy is "
                "refused (the engine must update its pool in place, donated)"
            )
        return self._manager

    def _build(self, arrays: list[jax.Array]) -> KVCacheManagerLike:
        shm = self.shm
        layout: dict[str, Any] = {}
        if shm is not None:
            layout = shm.layout(self.engine.geometry, self.engine.model_uid, self.host_blocks)
        try:
            if shm is None:
                return self._factory(arrays, self.host_blocks)
            shm.prepare(layout)
            with shm.building():
                manager = self._factory(arrays, self.host_blocks)
            shm.commit(layout)
            return manager
        except TransferError:
            raise
        except Exception as exc:
            raise TransferError(f"cannot start TPU Sync's KVCacheManager: {exc}") from exc

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
