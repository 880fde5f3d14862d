"""What the connector's scheduler side tells its worker for one engine step (picklable).

Light on purpose (no vLLM, torch or JAX): the scheduler side (agentpark.connectors.scheduler)
writes these, the torch worker (agentpark.connectors.torch_copies) and the TPU worker
(agentpark.connectors.tpu) read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoadMeta", "StepPlan", "StoreMeta", "store_meta"]


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
    hold: bool = False  # a pin's copy: the blocks stay allocated (the pin lets them go)


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
    # Pinned requests let go with no copy: the worker reports them in get_finished at
    # once, and vLLM frees their blocks.
    release: list[str] = field(default_factory=list)


def store_meta(
    req_id: str, block_ids: list[int], answer: dict[str, Any], *, hold: bool = False
) -> StoreMeta:
    """The copy a "parked" prepare_store answer asks for (only the blocks it says are fresh);
    ``hold``: a pinned answer's copy, whose blocks the pin still holds after it."""
    slots = [int(s) for s in answer["slots"]]
    fresh = [bool(f) for f in answer.get("fresh") or [True] * len(slots)]
    return StoreMeta(
        req_id,
        int(answer["store_id"]),
        [b for b, new in zip(block_ids, fresh, strict=True) if new],
        [s for s, new in zip(slots, fresh, strict=True) if new],
        bool(answer.get("checksum")),
        answer.get("pool_id"),
        hold,
    )
