"""What a generate may ask of an in-process engine: token ids of its vocabulary, a bounded
number of new tokens, and a session that fits the model and the pool (422 before anything
is touched; 409 ``context_full`` for a session that would not fit); and the 507 of a
pool without room."""

from __future__ import annotations

from collections.abc import Sequence

from agentpark.blocks import PoolGeometry
from agentpark.engine.base import EngineAdapter
from agentpark.errors import (
    ContextFullError,
    InvalidRequestError,
    LimitExceededError,
    PoolFullError,
)

__all__ = ["check_fits", "check_generate", "pool_full"]


def check_generate(
    engine: EngineAdapter, prompt_tokens: Sequence[int], max_new_tokens: int, limit: int
) -> None:
    """``max_new_tokens`` in 1..``limit``; every prompt token in the vocabulary."""
    if not 1 <= max_new_tokens <= limit:
        raise LimitExceededError(
            f"max_new_tokens must be between 1 and {limit}",
            max_new_tokens=max_new_tokens,
            limit=limit,
        )
    bad = [t for t in prompt_tokens if not 0 <= t < engine.vocab_size]
    if bad:
        raise InvalidRequestError(
            f"token ids must be in 0..{engine.vocab_size - 1}", bad_tokens=bad[:10]
        )


def check_fits(engine: EngineAdapter, total_tokens: int) -> None:
    """A session of ``total_tokens`` fits the model's length and the whole pool."""
    limit = engine.max_seq_len
    if total_tokens > limit:
        raise ContextFullError(
            f"session would hold {total_tokens} tokens; the model's limit is {limit} "
            "(tokens so far + prompt + max_new_tokens)",
            tokens=total_tokens,
            max_seq_len=limit,
        )
    geometry = engine.geometry
    blocks = geometry.blocks_for(total_tokens)
    if blocks > geometry.num_blocks:
        raise ContextFullError(
            f"session would need {blocks} KV blocks; the whole pool has {geometry.num_blocks}",
            blocks=blocks,
            pool_blocks=geometry.num_blocks,
        )


def pool_full(
    geometry: PoolGeometry, needed: int, free: int, total: int, waited_s: float | None = None
) -> PoolFullError:
    """507 ``pool_full``; with ``waited_s`` (a queue that did not move in time) a
    Retry-After too."""
    block = geometry.block_nbytes
    extra: dict[str, float] = {}
    if waited_s is not None:
        extra = {"waited_s": waited_s, "retry_after_s": min(waited_s, 5.0)}
    waited = "" if waited_s is None else f" after waiting {waited_s:g}s for room"
    return PoolFullError(
        f"KV pool is full{waited}: needs {needed} blocks ({needed * block} bytes), "
        f"{free} of {total} free",
        needed_blocks=needed,
        free_blocks=free,
        total_blocks=total,
        block_bytes=block,
        **extra,
    )
