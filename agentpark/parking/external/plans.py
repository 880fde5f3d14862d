"""What the external manager hands an engine, and the events it emits: plain values.

A plan names a tier by name and slots by number, never a live object, so it goes on the
wire as it is (:meth:`StorePlan.to_wire`). The in-flight records beside each plan are the
manager's own (the session, the tier object, the turn's events to commit with the park).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from agentpark.enums import RestoredFrom
from agentpark.store.models import EventRow
from agentpark.tiers.base import HostTier

__all__ = [
    "BlocksRemoved",
    "BlocksStored",
    "KVEvent",
    "LoadInFlight",
    "LoadPlan",
    "Restored",
    "StoreInFlight",
    "StorePlan",
]


@dataclass(frozen=True)
class StorePlan:
    """A park the engine carries out: copy its blocks ``i`` with ``fresh[i]`` into
    ``slots[i]`` of ``tier`` (the others are there already: the tier holds that content),
    then report with :meth:`ExternalManager.complete_store`, with the digest of each block
    it copied when ``checksum``."""

    store_id: int
    tier: str
    slots: tuple[int, ...]
    fresh: tuple[bool, ...]
    checksum: bool  # whether the engine must send the digest of each block it copied
    why: str
    expected_s: float | None

    def to_wire(self) -> dict[str, Any]:
        return {
            "store_id": self.store_id,
            "tier": self.tier,
            "slots": list(self.slots),
            "fresh": list(self.fresh),
            "checksum": self.checksum,
            "why": self.why,
        }


@dataclass(frozen=True)
class LoadPlan:
    """A load the engine carries out: parked blocks ``start_block ..`` from ``slots`` of
    ``tier`` into its own ``block_ids[start_block:]`` (it has ``..start_block`` itself);
    ``digests[i]`` is what block ``slots[i]`` must hash to (None: not checksummed)."""

    load_id: int
    tier: str
    slots: tuple[int, ...]
    digests: tuple[str | None, ...]
    start_block: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "load_id": self.load_id,
            "tier": self.tier,
            "slots": list(self.slots),
            "digests": list(self.digests),
        }


@dataclass(frozen=True)
class Restored:
    """What a load gave the engine: ``tokens`` prefix tokens now in its blocks."""

    tokens: int
    restored_from: RestoredFrom | None  # None: nothing restored, the engine computes all
    why: str


@dataclass(frozen=True)
class BlocksStored:
    """A session's copy of ``num_blocks`` blocks is committed in ``tier``."""

    tenant: str
    session_id: str
    tier: str
    num_blocks: int
    at: float


@dataclass(frozen=True)
class BlocksRemoved:
    """A session's copy in ``tier`` is gone (restored, moved, dropped, deleted)."""

    tenant: str
    session_id: str
    tier: str
    num_blocks: int
    at: float


KVEvent = BlocksStored | BlocksRemoved


@dataclass
class StoreInFlight:
    """The manager's side of a :class:`StorePlan`."""

    plan: StorePlan
    key: tuple[str, str]
    dst: HostTier
    tool: str | None
    pending: list[EventRow]  # the turn's, committed with the park's outcome
    owner: str | None = None  # who may complete it (a control connection); None: anyone
    started: float = field(default_factory=time.perf_counter)
    created: float = field(default_factory=time.monotonic)


@dataclass
class LoadInFlight:
    """The manager's side of a :class:`LoadPlan`; its slots are held by ``("load", id)``."""

    plan: LoadPlan
    key: tuple[str, str] | None  # the request's session; None: it has no name
    tier: HostTier
    block_ids: list[int]  # the engine's blocks of the request, 0 .. the last loaded one
    tokens: list[int]  # the request's tokens up to the end of the loaded blocks
    owner: str | None = None  # who may finish it (a control connection); None: anyone
    own: bool = False  # the session's own parked copy (restored), else blocks by content
    request_id: str | None = None  # the engine's request it serves (its events name it)
    started: float = field(default_factory=time.perf_counter)
    created: float = field(default_factory=time.monotonic)
