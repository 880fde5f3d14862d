"""The connector's worker side on vLLM-TPU (tpu-inference): copies through TPU Sync.

On tpu-inference the KV caches are JAX arrays, one per attention layer, blocks on axis 0
(``[num_blocks, block_size, 2 * kv_heads / packing, packing, head_dim]`` for its ragged
paged attention). Two facts shape this module (read in tpu-inference's own connectors,
see ../shared VLLM.md):

* the model runner's ``kv_caches`` list is REASSIGNED by every forward (the buffers are
  donated and come back as new ``jax.Array`` objects over the same device memory), so the
  worker holds the runner (tpu-inference calls the connector's ``register_runner``, not
  ``register_kv_caches``) and reads ``runner.kv_caches`` at every copy;
* ``wait_for_save`` runs only in steps that schedule tokens, so the connector runs stores
  from ``start_load_kv`` and ``get_finished`` too (:meth:`TpuWorker.run_stores` copies a
  store once, whichever hook comes first).

Copies go through TPU Sync's KVCacheManager as the daemon's tpu_sync backend drives it,
with the same shared code (agentpark.connectors.tpu_sync_manager: one ``d2h``/``h2d`` call
per direction over every layer, whole-block runs merged, offsets, duplicates and the
arrays' device addresses checked before any TPU Sync call). Nothing of the daemon is
loaded into vLLM's worker: only the wire protocol and those shared connector modules.

Where the parked bytes live: in TPU Sync's host memory, in THIS (vLLM's worker) process:
TPU Sync allocates its host blocks itself (pinned and in the TPU's tiled layout on a TPU)
and has no API to read them, so they cannot be in the daemon's /dev/shm pool file. The
worker sizes them (``tpu_sync_host_bytes``) and registers its layout with
:class:`~agentpark.connectors.protocol.Held`; the daemon keeps slot bookkeeping only (slot
``s`` = TPU Sync host block ``s``) and makes no pool file. Surviving a vLLM restart goes
through TPU Sync's own shm mode, hardened by
:class:`~agentpark.connectors.tpu_sync_shm.TpuSyncShm`, when
``tpu_sync_shm_dir`` is set; the host memory's ``instance`` (kept in that directory) tells
the daemon whether the parked copies it knows are still there. Integrity: none. No
checksum is taken or claimed (agentpark cannot read those bytes); a copy damaged in host
memory is not detected.

UNVERIFIED (no TPU here): everything that involves a TPU and tpu-inference: that
tpu-inference calls ``register_runner`` with a runner whose ``kv_caches`` keep their
device addresses across forwards (this module refuses copies when they move), TPU Sync's
DMA engine, pinned memory, tiled host layout and shm segments on a TPU host, sharded KV
caches (refused: the block axis must be unsharded; tensor parallel > 1 is off anyway).
What is verified, on JAX's CPU platform against TPU Sync's real wheel
(tests/connectors/tpu_real): the copies, bit for bit, across a donated step that replaces
the runner's list; the refusals before any TPU Sync call; the daemon's bookkeeping; a
worker restart re-attaching TPU Sync's shm segments.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import jax

from agentpark.blocks import PoolGeometry
from agentpark.connectors.client import ControlClient
from agentpark.connectors.copies import Copies, CopyRefused
from agentpark.connectors.protocol import Held, Layout
from agentpark.connectors.steps import LoadMeta, StoreMeta
from agentpark.connectors.tpu_sync_manager import (
    KVCacheManagerLike,
    ManagerFactory,
    build_manager,
    check_pairs,
    default_manager_factory,
    device_pointers,
    run_copy,
)
from agentpark.connectors.tpu_sync_shm import TpuSyncShm
from agentpark.errors import TransferError

__all__ = [
    "BACKEND",
    "DEFAULT_HOST_BYTES",
    "INSTANCE_FILE",
    "RunnerLike",
    "TpuSyncCopies",
    "TpuWorker",
    "host_config",
    "parse_bytes",
    "runner_layout",
]

log = logging.getLogger("vllm.agentpark")

BACKEND = "tpu_sync"
DEFAULT_HOST_BYTES = 1 << 30
REGISTER_RETRY_S = 10.0
"""An unregistered worker (the daemon was away at its start) asks again this often."""
INSTANCE_FILE = "agentpark-held-instance"
"""In ``tpu_sync_shm_dir``: the instance name of the host memory TPU Sync's segments hold."""
_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


class RunnerLike(Protocol):
    """What this module needs of tpu-inference's TPUModelRunner: its current KV arrays."""

    kv_caches: list[jax.Array]


def parse_bytes(value: object) -> int:
    """``1073741824``, ``"1073741824"`` or ``"8GiB"`` (KiB, MiB, GiB, TiB) -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        match = re.fullmatch(r"\s*(\d+)\s*([KMGT]iB|B)?\s*", str(value), re.IGNORECASE)
        if match is None:
            raise ValueError(f"not a size in bytes: {str(value)[:40]!r} (e.g. 8GiB)")
        n = int(match.group(1)) * _UNITS[(match.group(2) or "").lower()]
    if n <= 0:
        raise ValueError(f"a size must be positive, got {n}")
    return n


def runner_layout(
    kv_caches: Sequence[jax.Array],
    block_size: int,
    model_uid: str,
    num_blocks: int | None = None,
) -> Layout:
    """The layout read from the runner's arrays (never assumed): blocks on axis 0 of each.

    ``num_blocks``: what vLLM's KV cache config says, checked against the arrays.
    ValueError for arrays TPU Sync cannot copy as one pool.
    """
    if not kv_caches:
        raise ValueError("the runner has no KV caches")
    first = kv_caches[0]
    blocks = int(first.shape[0])
    if num_blocks is not None and blocks != num_blocks:
        raise ValueError(f"axis 0 has {blocks} blocks, vLLM's KV cache config {num_blocks}")
    arrays: list[tuple[tuple[int, ...], str]] = []
    for i, arr in enumerate(kv_caches):
        if not isinstance(arr, jax.Array):
            raise ValueError(f"kv_caches[{i}] is a {type(arr).__name__}, not a jax.Array")
        if arr.ndim < 2 or int(arr.shape[0]) != blocks:
            raise ValueError(f"kv_caches[{i}] {tuple(arr.shape)}: not {blocks} blocks on axis 0")
        if arr.dtype != first.dtype:
            raise ValueError("KV caches of different dtypes")
        arrays.append((tuple(int(d) for d in arr.shape[1:]), f"uint{8 * arr.dtype.itemsize}"))
    return Layout(model_uid, block_size, blocks, tuple(arrays), f"jax.{first.dtype}")


class TpuSyncCopies:
    """Copies between a runner's KV arrays and TPU Sync's host blocks (the daemon's slots).

    The runner's arrays are read anew at every copy; TPU Sync is bound to their device
    memory at :meth:`start` and every copy after which they sit elsewhere is refused: a
    donated forward keeps them in place (checked on CPU), a reallocation (e.g.
    tpu-inference's ``reinitialize_kv_cache``) does not.

    UNVERIFIED (no TPU here): on a TPU the copies are TPU Sync's DMA into its pinned host
    memory; on CPU (tested) they are a memcpy inside TPU Sync.
    """

    def __init__(
        self,
        runner: RunnerLike,
        layout: Layout,
        host_blocks: int,
        *,
        shm_dir: Path | None = None,
        manager_factory: ManagerFactory | None = None,
    ) -> None:
        self.runner = runner
        self.layout = layout
        self.geometry = PoolGeometry.from_layout(
            layout.num_blocks, layout.block_size, layout.arrays
        )
        self.host_blocks = host_blocks
        self.shm_dir = None if shm_dir is None else Path(shm_dir)
        self.shm = None if self.shm_dir is None else TpuSyncShm(self.shm_dir)
        self._factory = manager_factory or default_manager_factory(enable_shm=self.shm is not None)
        self._manager: KVCacheManagerLike | None = None
        self._pointers: tuple[int, ...] = ()
        self.lock = threading.RLock()

    def start(self) -> str:
        """Build TPU Sync's manager over the runner's arrays; the host memory's instance.

        With shm: TPU Sync's segments are re-attached when their layout matches, and the
        instance recorded beside them is kept; otherwise (and without shm) a new instance.
        The record is removed before the build, so a crash mid-way leaves none (the daemon
        then drops the old copies rather than trusting segments that may be new).
        """
        previous = self._take_instance()
        with self.lock:
            self._bound()
        if self.shm is not None and self.shm.reattached and previous:
            instance = previous
        else:
            instance = f"{'shm' if self.shm else 'mem'}-{uuid.uuid4().hex}"
        self._write_instance(instance)
        return instance

    def store(self, block_ids: Sequence[int], slots: Sequence[int]) -> None:
        """Runner blocks ``block_ids[i]`` -> host blocks ``slots[i]``, every layer."""
        check_pairs(block_ids, self.geometry.num_blocks, slots, self.host_blocks)
        if block_ids:
            with self.lock:
                run_copy("pause (d2h)", self._bound().d2h, block_ids, slots)

    def load(self, slots: Sequence[int], block_ids: Sequence[int]) -> None:
        """Host blocks ``slots[i]`` -> runner blocks ``block_ids[i]``, every layer, in place."""
        check_pairs(block_ids, self.geometry.num_blocks, slots, self.host_blocks)
        if block_ids:
            with self.lock:
                run_copy("restore (h2d)", self._bound().h2d, slots, block_ids)

    def _arrays(self) -> list[jax.Array]:
        """The runner's KV arrays now; TransferError unless they still have the layout."""
        arrays = list(self.runner.kv_caches)
        shapes = [(tuple(int(d) for d in a.shape[1:]), int(a.shape[0])) for a in arrays]
        expected = [(s.block_shape, self.geometry.num_blocks) for s in self.geometry.arrays]
        if shapes != expected:
            raise TransferError("the runner's KV caches no longer have the registered layout")
        return arrays

    def _bound(self) -> KVCacheManagerLike:
        """The manager, built on first use; the arrays must not have moved since. Hold the lock."""
        arrays = self._arrays()
        try:
            jax.block_until_ready(arrays)  # type: ignore[no-untyped-call]
            pointers = device_pointers(arrays)
        except Exception as exc:
            raise TransferError(f"the runner's KV caches are not usable: {exc}") from exc
        if self._manager is None:
            self._manager = build_manager(
                self._factory,
                arrays,
                self.host_blocks,
                shm=self.shm,
                geometry=self.geometry,
                model_uid=self.layout.model_uid,
            )
            self._pointers = pointers
        elif pointers != self._pointers:
            raise TransferError(
                "the runner's KV caches moved in device memory since TPU Sync was bound to "
                "them; TPU Sync copies to and from the memory it was given, so the copy is "
                "refused (the runner must update them in place, donated)"
            )
        return self._manager

    def _instance_path(self) -> Path | None:
        return None if self.shm_dir is None else self.shm_dir / INSTANCE_FILE

    def _take_instance(self) -> str | None:
        path = self._instance_path()
        if path is None:
            return None
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            return None
        path.unlink()
        return text if re.fullmatch(r"shm-[0-9a-f]{32}", text) else None

    def _write_instance(self, instance: str) -> None:
        path = self._instance_path()
        if path is None:
            return
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(instance)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)


class TpuWorker(Copies):
    """The connector's worker copies on tpu-inference (torch's are in connectors.torch_copies).

    Builds TPU Sync's manager at once (the host memory is the worker's, sized by
    ``host_bytes``), then registers the layout with the daemon. Every store is reported
    (``complete_store``, never with a checksum) and every load (``load_done``); a load
    that could not run names its blocks in :meth:`run_loads`'s answer, for vLLM to
    recompute. A copy for another pool id than this worker's (the daemon knew another
    host memory) is never run: the worker registers again instead.

    UNVERIFIED (no TPU here): the integration with tpu-inference's runner and connector
    calls; tested on CPU with a runner-like object and the real TPU Sync wheel.
    """

    stores_at_start = True  # wait_for_save runs only when tokens are scheduled

    def __init__(
        self,
        client: ControlClient,
        runner: RunnerLike,
        *,
        block_size: int,
        model_uid: str,
        host_bytes: int = DEFAULT_HOST_BYTES,
        shm_dir: Path | None = None,
        num_blocks: int | None = None,
        manager_factory: ManagerFactory | None = None,
    ) -> None:
        super().__init__(client)
        layout = runner_layout(runner.kv_caches, block_size, model_uid, num_blocks)
        geometry = PoolGeometry.from_layout(layout.num_blocks, layout.block_size, layout.arrays)
        host_blocks = host_bytes // geometry.block_nbytes
        if host_blocks <= 0:
            raise ValueError(f"tpu_sync_host_bytes {host_bytes} is less than one block")
        self.copies = TpuSyncCopies(
            runner, layout, host_blocks, shm_dir=shm_dir, manager_factory=manager_factory
        )
        self.held = Held(BACKEND, self.copies.start(), host_blocks)
        self.pool_id = f"{BACKEND}:{self.held.instance}"
        self.registered = False
        self._next_register = 0.0
        log.info(
            "agentpark worker (TPU): TPU Sync holds %d host blocks of %d bytes (%s)",
            host_blocks,
            geometry.block_nbytes,
            f"shm segments in {shm_dir}" if shm_dir else "process memory: not kept over restarts",
        )

    @property
    def layout(self) -> Layout:
        return self.copies.layout

    def register(self) -> bool:
        """Tell the daemon the layout and where the bytes are held; False if it did not take it.

        Quick for the daemon (a record, no file): bounded at 5 s, off the scheduling path.
        """
        self._next_register = time.monotonic() + REGISTER_RETRY_S
        answer = self.client.call(
            "register", wait_s=5.0, layout=self.layout.to_wire(), held=self.held.to_wire()
        )
        if answer is None:
            return False
        if not answer.get("ok"):
            self.client.degraded("layout_refused", str(answer.get("error")))
            return False
        held = answer.get("held")
        self.registered = isinstance(held, dict) and held.get("pool_id") == self.pool_id
        return self.registered

    def maybe_register(self) -> bool:
        """Register if not registered yet (at most every ``REGISTER_RETRY_S``): without it a
        daemon that was away when vLLM started would never get a pool to plan parks in."""
        if not self.registered and time.monotonic() >= self._next_register:
            self.register()
        return self.registered

    def store(self, store: StoreMeta) -> list[str] | None:
        """Never a checksum: agentpark cannot read TPU Sync's host blocks."""
        if store.pool_id != self.pool_id:
            self.register()
            raise CopyRefused(f"the daemon's pool {store.pool_id} is not this worker's")
        try:
            self.copies.store(store.block_ids, store.slots)
        except (ValueError, TransferError) as exc:
            log.warning("agentpark worker (TPU): store %d: copy refused: %s", store.store_id, exc)
            raise CopyRefused(f"copy refused: {exc}") from exc
        return None

    def load(self, load: LoadMeta) -> None:
        if load.pool_id != self.pool_id:
            self.register()
            raise CopyRefused(
                f"the daemon's pool {load.pool_id} is not this worker's", "pool_changed"
            )
        try:
            self.copies.load(load.slots, load.block_ids)
        except ValueError as exc:
            log.warning("agentpark worker (TPU): load %d refused: %s", load.load_id, exc)
            raise CopyRefused(str(exc)) from exc


def host_config(extra: dict[str, Any]) -> tuple[int, Path | None]:
    """``tpu_sync_host_bytes`` (default 1 GiB) and ``tpu_sync_shm_dir`` from the extra config."""
    host_bytes = parse_bytes(extra.get("tpu_sync_host_bytes", DEFAULT_HOST_BYTES))
    shm_dir = extra.get("tpu_sync_shm_dir")
    return host_bytes, None if shm_dir in (None, "") else Path(str(shm_dir))
