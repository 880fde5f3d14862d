"""What the connector's scheduler side tells its worker for one engine step (picklable).

Light on purpose (no vLLM, torch or JAX): the torch worker (agentpark.connectors.vllm) and
the TPU worker (agentpark.connectors.tpu) both read these.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LoadMeta", "StoreMeta"]


@dataclass
class StoreMeta:
    """A park to copy: engine blocks ``block_ids[i]`` into pool slots ``slots[i]``."""

    req_id: str
    store_id: int
    block_ids: list[int]
    slots: list[int]
    checksum: bool  # whether the daemon wants the copy's checksum (never for held bytes)
    pool_id: str | None


@dataclass
class LoadMeta:
    """A load to run: pool slots ``slots[i]`` into engine blocks ``block_ids[i]``."""

    req_id: str
    load_id: int
    block_ids: list[int]  # the engine blocks to fill, in order
    slots: list[int]  # the pool slots they come from
    parked_slots: list[int]  # the whole parked copy (what the checksum covers)
    checksum: str | None
    pool_id: str | None
