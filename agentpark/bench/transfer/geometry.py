"""The KV geometry of ``agentpark bench transfer``: a mid-sized model's KV per token, and
the block size that divides every benched size."""

from __future__ import annotations

import math
from collections.abc import Sequence

from agentpark.engine.reference import ModelSpec

__all__ = ["MAX_BLOCK_TOKENS", "MODEL", "TOKEN_BYTES", "block_tokens"]

# A KV geometry of a mid-sized model: 4 layers x K,V x 8 KV heads x 128 dims x 2 bytes
# = 16 KiB per token; a block is up to 64 tokens (1 MiB). The rest of the model is tiny:
# nothing is ever computed with it, but building the engine initialises its weights.
MODEL = ModelSpec(d_model=64, n_layers=4, n_heads=8, n_kv_heads=8, head_dim=128, ffn_dim=64)
TOKEN_BYTES = MODEL.n_layers * 2 * MODEL.n_kv_heads * MODEL.head_dim * 2
MAX_BLOCK_TOKENS = 64


def block_tokens(sizes: Sequence[int]) -> int:
    """The largest power of two <= MAX_BLOCK_TOKENS tokens that divides every size."""
    tokens = math.gcd(*(s // TOKEN_BYTES for s in sizes))
    block = 1
    while block * 2 <= MAX_BLOCK_TOKENS and tokens % (block * 2) == 0:
        block *= 2
    return block
