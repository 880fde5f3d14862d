"""Block keys: vLLM's block-hash chain, computed here exactly as vLLM 0.32 computes it.

A block's key is ``hash((parent_key, block_token_ids, extra_keys))`` with the first
block's parent ``NONE_HASH = hash(seed)`` (vllm/v1/core/kv_cache_utils.py:
``hash_block_tokens``, ``init_none_hash``, ``generate_block_hash_extra_keys``). Only whole
blocks have a key. Extra keys are vLLM's: the LoRA adapter ``("lora", name, path)`` on
every block, then ``("cache_salt", salt)`` on the first block only; none gives ``None``.

So the same tokens give the same keys in the daemon, in vLLM's prefix cache and in a
router that recomputes them from token ids (the KV events). ``hash`` is vLLM's
``--prefix-caching-hash-algo``: ``sha256`` (its default: SHA-256 of the pickle) or
``sha256_cbor`` (SHA-256 of canonical CBOR, for consumers that are not Python). The seed
is vLLM's default (``"vllm-none-hash"``) unless vLLM runs with PYTHONHASHSEED, which it
then uses instead: set ``none_hash_seed`` the same.

Light: hashlib and pickle only (cbor2 is imported for ``sha256_cbor`` alone).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["DEFAULT_SEED", "BlockHasher", "HashAlgo", "Lora"]

DEFAULT_SEED = "vllm-none-hash"
HashAlgo = Literal["sha256", "sha256_cbor"]


def _sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    import cbor2  # only for this algorithm: vLLM has it, the daemon needs it only here

    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


_ALGOS: dict[str, Callable[[Any], bytes]] = {"sha256": _sha256, "sha256_cbor": _sha256_cbor}


@dataclass(frozen=True)
class Lora:
    """A LoRA adapter as vLLM keys it: its name and path (a re-pointed name is new KV)."""

    name: str
    path: str


class BlockHasher:
    """The chain of block keys of a token sequence, for one block size and algorithm."""

    def __init__(
        self, block_size: int, algo: HashAlgo = "sha256", seed: str = DEFAULT_SEED
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if algo not in _ALGOS:
            raise ValueError(f"unknown hash algorithm {algo!r}; one of {', '.join(_ALGOS)}")
        self.block_size = block_size
        self.algo = algo
        self._hash = _ALGOS[algo]
        self.none_hash = self._hash(seed)

    def chain(
        self,
        tokens: Sequence[int],
        *,
        cache_salt: str | None = None,
        lora: Lora | None = None,
        parent: bytes | None = None,
        first_block: int = 0,
    ) -> list[bytes]:
        """The keys of every whole block of ``tokens`` (a partial last block has none).

        ``parent`` / ``first_block``: continue a chain whose block ``first_block - 1`` has
        key ``parent`` (``tokens`` then starts at that block), so a longer request
        re-hashes only its new blocks.
        """
        bs = self.block_size
        ids = [int(t) for t in tokens]  # numpy ints pickle differently: plain ints only
        keys: list[bytes] = []
        prev = parent
        lora_keys: list[tuple[str, ...]] = [("lora", lora.name, lora.path)] if lora else []
        for i in range(len(ids) // bs):
            extra: list[tuple[str, ...]] = list(lora_keys)
            if first_block + i == 0 and cache_salt:
                extra.append(("cache_salt", cache_salt))
            block = tuple(ids[i * bs : (i + 1) * bs])
            prev = self._hash((prev or self.none_hash, block, tuple(extra) if extra else None))
            keys.append(prev)
        return keys
