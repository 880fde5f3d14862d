"""The DMA core: backends that move KV blocks between the engine's pool and host tiers.

=============  ==================================================  =========================
backend        how                                                 where
=============  ==================================================  =========================
host_copy      memcpy-class gather/scatter on host memory          CPU platform (auto there)
jax_memkind    ``jax.device_put`` device <-> pinned_host           GPU/TPU (auto there); CPU
tpu_sync       Google's TPU Sync KVCacheManager d2h/h2d            TPU, ``agentpark[tpu]``;
                                                                   CPU only when opted in
=============  ==================================================  =========================

:func:`select_transfer` (agentpark.dma.select) turns the ``dma.backend`` setting into a
backend at start and refuses, with a ConfigError naming the key, the choice and why, one
that cannot work here. :func:`bytes_in_tier` says whether a backend keeps the parked bytes
in the tier's numpy buffers (tpu_sync does not: they live in TPU Sync's own host memory).
"""

from __future__ import annotations

from agentpark.dma.base import Transfer
from agentpark.dma.host_copy import HostCopyTransfer
from agentpark.dma.jax_memkind import JaxMemkindTransfer
from agentpark.dma.select import BACKENDS, bytes_in_tier, select_transfer
from agentpark.dma.tpu_sync import TpuSyncShm, TpuSyncTransfer

__all__ = [
    "BACKENDS",
    "HostCopyTransfer",
    "JaxMemkindTransfer",
    "TpuSyncShm",
    "TpuSyncTransfer",
    "Transfer",
    "bytes_in_tier",
    "select_transfer",
]
