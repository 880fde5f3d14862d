"""A parked copy as SQLite records it (``sessions.parked_handle``), written and read here.

``{"slots": [..], "keys": [hex | null, ..], "digests": [str | null, ..]}``: the tier
slot, block key (vLLM's hash, hex; the tenant is the row's) and digest of each block, in
the session's block order. A block shared by several sessions appears in each of their
handles with the same slot, key and digest, so a restart rebuilds the tier's index and
refcounts from the handles alone. ``row.checksum`` names the scheme (``xxh3b:`` and a
hash of the digests, for the views); its digests are the handle's.

A handle with ``slots`` only is a copy parked before keys (``row.checksum`` covers the
copy whole): it is read, verified and restored the old way, and never shared.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import xxhash

from agentpark.integrity import BLOCK_SCHEME
from agentpark.store.models import SessionRow

__all__ = [
    "copy_checksum",
    "handle_digests",
    "handle_keys",
    "handle_slots",
    "keys_hex",
    "parked_handle",
]


def parked_handle(
    slots: Sequence[int], keys: Sequence[Hashable | None], digests: Sequence[str | None]
) -> dict[str, Any]:
    """The JSON SQLite keeps of a copy stored by content."""
    return {
        "slots": list(slots),
        "keys": keys_hex(keys),
        "digests": list(digests),
    }


def copy_checksum(digests: Sequence[str | None]) -> str | None:
    """One name for the whole copy, from its blocks' digests (None: not checksummed)."""
    if not digests or any(d is None for d in digests):
        return None
    joined = "\n".join(d for d in digests if d is not None).encode()
    return f"{BLOCK_SCHEME}:{xxhash.xxh3_64_hexdigest(joined)}"


def handle_slots(row: SessionRow) -> list[int]:
    return [int(s) for s in (row.parked_handle or {}).get("slots", [])]


def handle_keys(row: SessionRow) -> list[Hashable | None]:
    """The blocks' keys as the tiers index them (tenant, hash); all None before keys."""
    handle = row.parked_handle or {}
    raw = handle.get("keys")
    if raw is None:
        return [None] * len(handle.get("slots", []))
    return [None if k is None else (row.tenant, bytes.fromhex(k)) for k in raw]


def handle_digests(row: SessionRow) -> list[str | None] | None:
    """The blocks' digests; None for a copy parked before keys (``row.checksum``)."""
    raw = (row.parked_handle or {}).get("digests")
    return None if raw is None else [None if d is None else str(d) for d in raw]


def keys_hex(keys: Sequence[Hashable | None]) -> list[str | None]:
    """Block keys ``(tenant, hash)`` as SQLite and the moves' wire keep them: the hash in
    hex (the tenant is the row's or the manifest's); None stays None."""
    return [None if k is None else _hash_of(k).hex() for k in keys]


def _hash_of(key: Hashable) -> bytes:
    assert isinstance(key, tuple) and isinstance(key[1], bytes)
    return key[1]
