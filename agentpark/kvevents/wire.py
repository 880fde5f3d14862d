"""vLLM's KV event structures, byte for byte, without importing vLLM.

vllm/distributed/kv_events.py (0.32): ``KVEventBatch(ts, events, data_parallel_rank)`` is an
array-like msgspec struct (a msgpack array, trailing defaults omitted); each event is a
tagged struct (``tag=True``: a msgpack map whose ``"type"`` is the class name, fields
equal to their default omitted). The fields below are vLLM's, in vLLM's order, with the
same defaults, so vLLM's own ``msgspec.msgpack.Decoder(KVEventBatch)`` decodes what
:func:`encode_batch` writes (tests/vllm_real/test_kv_events.py proves it).

Block hashes are vLLM's ``ExternalBlockHash``: ``int`` (the low 64 bits of the 32-byte
hash read big-endian, vLLM's default ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``) or the
32 bytes themselves.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVEventBatch",
    "encode_batch",
    "external_hash",
]

HashFormat = Literal["int", "bytes"]
ExternalBlockHash = bytes | int


class _Event(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """vLLM's ``KVCacheEvent``: tagged by class name."""


class BlockStored(_Event):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(_Event):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(_Event):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


_ENCODER = msgspec.msgpack.Encoder()


def encode_batch(batch: KVEventBatch) -> bytes:
    """The payload frame of one published batch."""
    return _ENCODER.encode(batch)


def external_hash(key_hash: bytes, fmt: HashFormat) -> ExternalBlockHash:
    """A block key as vLLM publishes it (``maybe_convert_block_hash``)."""
    if fmt == "bytes":
        return key_hash
    return int.from_bytes(key_hash, "big") & ((1 << 64) - 1)
