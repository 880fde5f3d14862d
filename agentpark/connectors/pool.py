"""The host pool as the engine's worker sees it: the daemon's tier file, mapped, as tensors.

The worker copies whole blocks between its KV tensors and the pool's slots: out with an
``index_select`` of the engine's blocks into the pool's rows, back with an
``index_copy_``. The checksum of a copy is agentpark's own (agentpark.integrity, of the
pool's bytes), so the daemon verifies nothing itself and the definition stays one.

CUDA (UNVERIFIED: no GPU here): the mapped file is registered as pinned host memory
(``cudaHostRegister``) so copies to and from it are DMA, and they run on the current
stream (the engine's), synchronised before a copy is reported done.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from agentpark.blocks import PoolGeometry
from agentpark.connectors.protocol import Layout, PoolFile
from agentpark.integrity import block_digests, blocks_intact
from agentpark.tiers.base import HostTier
from agentpark.tiers.filetier import read_header

__all__ = ["MappedPool"]

log = logging.getLogger("vllm.agentpark")


class _Buffers:
    """What agentpark.integrity needs of a tier: its geometry and its numpy buffers."""

    def __init__(self, geometry: PoolGeometry, buffers: list[np.ndarray]) -> None:
        self.geometry = geometry
        self._buffers = buffers

    def buffers(self) -> list[np.ndarray]:
        return self._buffers


class MappedPool:
    """The pool file mapped read-write; ``tensors[i]`` is array ``i``, slot axis first."""

    def __init__(self, pool: PoolFile, layout: Layout, kv_dtype: torch.dtype) -> None:
        header = read_header(Path(pool.path))  # ValueError for a file that is not a pool
        if header.get("model_uid") != layout.model_uid:
            raise ValueError(
                f"{pool.path} holds {header.get('model_uid')!r}, not {layout.model_uid!r}"
            )
        if int(header.get("capacity_blocks", -1)) != pool.capacity_blocks:
            raise ValueError(f"{pool.path}: capacity differs from what the daemon said")
        self.pool = pool
        self.geometry = PoolGeometry.from_layout(
            layout.num_blocks, layout.block_size, layout.arrays
        )
        fd = os.open(pool.path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size != pool.file_bytes:
                raise ValueError(f"{pool.path} is not {pool.file_bytes} bytes")
            self._map = mmap.mmap(fd, pool.file_bytes, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self.tensors: list[torch.Tensor] = []
        arrays: list[np.ndarray] = []
        for spec, offset, nbytes in zip(
            self.geometry.arrays, pool.offsets, pool.block_nbytes, strict=True
        ):
            if spec.block_nbytes != nbytes:
                raise ValueError("the pool's block size differs from this layout's")
            count = pool.capacity_blocks * nbytes
            raw = torch.frombuffer(self._map, dtype=torch.uint8, count=count, offset=offset)
            self.tensors.append(raw.view(kv_dtype).view(pool.capacity_blocks, *spec.block_shape))
            flat = np.frombuffer(
                self._map,
                dtype=spec.dtype,
                count=count // np.dtype(spec.dtype).itemsize,
                offset=offset,
            )
            arrays.append(flat.reshape(pool.capacity_blocks, *spec.block_shape))
        self._view = _Buffers(self.geometry, arrays)
        self.pinned = False

    def pin_for_cuda(self) -> None:
        """UNVERIFIED (no GPU here): register the mapping as pinned memory for DMA."""
        cudart = torch.cuda.cudart()
        for tensor in self.tensors:
            size = tensor.numel() * tensor.element_size()
            code = cudart.cudaHostRegister(tensor.data_ptr(), size, 0)
            if int(code) != 0:
                raise RuntimeError(f"cudaHostRegister failed ({code})")
        self.pinned = True

    # ---- copies ---------------------------------------------------------------------------

    def store(
        self, sources: Sequence[torch.Tensor], block_ids: Sequence[int], slots: Sequence[int]
    ) -> None:
        """Engine blocks ``block_ids[i]`` -> pool slots ``slots[i]``, every array."""
        ids = torch.tensor(list(block_ids), dtype=torch.long)
        dst_slots = torch.tensor(list(slots), dtype=torch.long)
        for src, dst in zip(sources, self.tensors, strict=True):
            rows = src.index_select(0, ids.to(src.device))
            if rows.device.type != "cpu":  # CUDA: UNVERIFIED; pinned pool, engine's stream
                rows = rows.to("cpu", non_blocking=self.pinned)
                torch.cuda.current_stream().synchronize()
            dst.index_copy_(0, dst_slots, rows)

    def load(
        self, targets: Sequence[torch.Tensor], slots: Sequence[int], block_ids: Sequence[int]
    ) -> None:
        """Pool slots ``slots[i]`` -> engine blocks ``block_ids[i]``, every array."""
        src_slots = torch.tensor(list(slots), dtype=torch.long)
        ids = torch.tensor(list(block_ids), dtype=torch.long)
        for src, dst in zip(self.tensors, targets, strict=True):
            rows = src.index_select(0, src_slots)
            if dst.device.type != "cpu":  # CUDA: UNVERIFIED
                rows = rows.to(dst.device, non_blocking=self.pinned)
            dst.index_copy_(0, ids.to(dst.device), rows)
        if any(t.device.type == "cuda" for t in targets):
            torch.cuda.current_stream().synchronize()

    def digests(self, slots: Sequence[int]) -> list[str]:
        """Each slot's block digest (agentpark.integrity), as the daemon keeps them."""
        return block_digests(self._as_tier(), list(slots))

    def intact(self, slots: Sequence[int], expected: Sequence[str | None]) -> bool:
        return blocks_intact(self._as_tier(), list(slots), list(expected))

    def _as_tier(self) -> HostTier:
        return self._view  # type: ignore[return-value]  # integrity reads geometry, buffers

    def close(self) -> None:
        self.tensors = []
        self._view = _Buffers(self.geometry, [])
        try:
            self._map.close()
        except BufferError:
            log.debug("pool map still viewed; it closes with its last view")
