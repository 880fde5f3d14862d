"""The DMA core: backends that move KV blocks between the engine's pool and host tiers."""

from __future__ import annotations

import jax

from agentpark.dma.base import Transfer, contiguous_runs
from agentpark.dma.host_copy import HostCopyTransfer
from agentpark.errors import ConfigError

__all__ = ["HostCopyTransfer", "Transfer", "contiguous_runs", "select_transfer"]


def select_transfer(backend: str) -> Transfer:
    """``auto`` picks host_copy on the CPU platform, where the pool lives in host memory."""
    platform = jax.default_backend()
    if backend in ("auto", "host_copy"):
        if platform != "cpu":
            raise ConfigError(
                f"dma.backend={backend!r}: host_copy needs the pool in host memory, but JAX's "
                f"platform is {platform!r}; accelerator backends are not available yet"
            )
        return HostCopyTransfer()
    raise ConfigError(f"dma.backend={backend!r} is not supported (allowed: auto, host_copy)")
