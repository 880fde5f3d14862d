"""The worker's copies on torch KV caches (vLLM on CPU, or CUDA: UNVERIFIED) through the pool.

``register_kv_caches`` hands the worker its KV tensors; :meth:`TorchCopies.read` reads the
layout from them (shape, dtype, the block axis: never assumed) and the daemon makes or
re-attaches the pool file for it, which :class:`~agentpark.connectors.pool.MappedPool`
maps. A copy for another pool than the mapped one (the daemon restarted, or took another
layout) registers again first; a load whose parked copy fails its checksum is not used.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import numpy as np
import torch

from agentpark.connectors.client import ControlClient
from agentpark.connectors.copies import Copies, CopyRefused
from agentpark.connectors.pool import MappedPool
from agentpark.connectors.protocol import Layout, PoolFile
from agentpark.connectors.sizing import kv_cache_bytes, register_wait_s
from agentpark.connectors.steps import LoadMeta, StoreMeta

__all__ = ["TorchCopies", "read_layout"]

log = logging.getLogger("vllm.agentpark")


def read_layout(
    kv_caches: Mapping[str, torch.Tensor],
    num_blocks: int,
    block_size: int,
    model_uid: Callable[[str], str],
) -> tuple[list[torch.Tensor], Layout]:
    """One source view per copyable array, block axis first, and the layout they make.

    ``model_uid`` names the model for a KV dtype. ValueError for caches it cannot copy.
    """
    sources: list[torch.Tensor] = []
    dtype: torch.dtype | None = None
    for name, tensor in kv_caches.items():
        axes = [d for d, size in enumerate(tensor.shape) if size == num_blocks]
        if not axes:
            raise ValueError(f"{name}: no axis of {num_blocks} blocks in {tuple(tensor.shape)}")
        if dtype is not None and tensor.dtype != dtype:
            raise ValueError("layers of different dtypes")
        dtype = tensor.dtype
        views = [tensor]
        for _ in range(axes[0]):  # split leading axes (e.g. CUDA's K/V) into arrays
            views = [v[i] for v in views for i in range(v.shape[0])]
        sources.extend(views)
    if dtype is None:
        raise ValueError("no KV tensors")
    np_dtype = f"uint{8 * sources[0].element_size()}"
    np.dtype(np_dtype)
    arrays = tuple((tuple(int(d) for d in v.shape[1:]), np_dtype) for v in sources)
    layout = Layout(model_uid(str(dtype)), block_size, num_blocks, arrays, str(dtype))
    return sources, layout


class TorchCopies(Copies):
    """Copies between the worker's KV tensors and the daemon's pool file, mapped."""

    def __init__(self, client: ControlClient, sources: list[torch.Tensor], layout: Layout) -> None:
        super().__init__(client)
        self.sources = sources
        self.layout = layout
        self.pool: MappedPool | None = None

    def ensure_pool(self, pool_id: str | None) -> MappedPool | None:
        """The mapped pool, registering (again) when there is none or it is not ``pool_id``."""
        pool = self.pool
        if pool is not None and (pool_id is None or pool.pool.pool_id == pool_id):
            return pool
        # The wait grows with what the daemon has to make (agentpark.connectors.sizing).
        wait_s = register_wait_s(kv_cache_bytes(self.layout.num_blocks, self.layout.arrays))
        answer = self.client.call("register", wait_s=wait_s, layout=self.layout.to_wire())
        if answer is None:
            return None
        if not answer.get("ok"):
            self.client.degraded("layout_refused", str(answer.get("error")))
            return None
        try:
            mapped = MappedPool(
                PoolFile.from_wire(answer["pool"]), self.layout, self.sources[0].dtype
            )
            if self.sources[0].device.type == "cuda":
                mapped.pin_for_cuda()  # UNVERIFIED
        except (ValueError, OSError, RuntimeError) as exc:
            self.client.degraded("pool_unmapped", f"cannot map the host pool: {exc}")
            return None
        if pool is not None:
            pool.close()
        self.pool = mapped
        log.info(
            "agentpark worker: pool %s mapped (%d slots)",
            mapped.pool.path,
            mapped.pool.capacity_blocks,
        )
        return mapped

    def store(self, store: StoreMeta) -> list[str] | None:
        pool = self.ensure_pool(store.pool_id)
        if pool is None:
            raise CopyRefused("the worker has no host pool mapped")
        pool.store(self.sources, store.block_ids, store.slots)
        return pool.digests(store.slots) if store.checksum else None

    def load(self, load: LoadMeta) -> None:
        pool = self.ensure_pool(load.pool_id)
        if pool is None:
            raise CopyRefused("the worker has no host pool mapped", "pool_unmapped")
        if load.digests is not None and not pool.intact(load.slots, load.digests):
            raise CopyRefused("a parked block fails its checksum", "checksum")
        pool.load(self.sources, load.slots, load.block_ids)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
