"""What the connector's scheduler side tells its worker for one engine step (picklable).

Light on purpose (no vLLM, torch or JAX): the scheduler side (agentpark.connectors.scheduler)
writes these, the torch worker (agentpark.connectors.torch_copies) and the TPU worker
(agentpark.connectors.tpu) read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["LoadMeta", "StepPlan", "StoreMeta"]


@dataclass
class StoreMeta:
    """A park to copy: engine blocks ``block_ids[i]`` into pool slots ``slots[i]`` (only
    the blocks the pool lacks: the daemon shares the others by content)."""

    req_id: str
    store_id: int
    block_ids: list[int]
    slots: list[int]
    checksum: bool  # whether the daemon wants each block's digest (never for held bytes)
    pool_id: str | None


@dataclass
class LoadMeta:
    """A load to run: pool slots ``slots[i]`` into engine blocks ``block_ids[i]``."""

    req_id: str
    load_id: int
    block_ids: list[int]  # the engine blocks to fill, in order
    slots: list[int]  # the pool slots they come from
    digests: list[str | None] | None  # what each slot's block must hash to (None: unchecked)
    pool_id: str | None


@dataclass
class StepPlan:
    """One engine step's copies: vLLM's metadata for the step (agentpark.connectors.vllm)."""

    stores: list[StoreMeta] = field(default_factory=list)
    loads: list[LoadMeta] = field(default_factory=list)
    invalid: list[int] = field(default_factory=list)  # blocks vLLM must recompute
