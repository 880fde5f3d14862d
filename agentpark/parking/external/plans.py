"""What the external manager hands an engine, and the events it emits: plain values.

A plan names a tier by name and slots by number, never a live object, so it goes on the
wire as it is (:meth:`StorePlan.to_wire`). The in-flight records beside each plan are the
manager's own (the session, the tier object, the turn's events to commit with the park).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from agentpark.enums import Reason, RestoredFrom
from agentpark.store.models import EventRow, SessionRow
from agentpark.tiers.base import HostTier

__all__ = [
    "BlocksRemoved",
    "BlocksStored",
    "KVEvent",
    "LoadInFlight",
    "LoadPlan",
    "Pinned",
    "Restored",
    "StoreInFlight",
    "StorePlan",
    "TurnEndAsk",
    "TurnEndChoice",
    "TurnEndFacts",
    "TurnEndRule",
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
    # A pin with this copy behind it: the engine copies and still holds the blocks.
    pin: Pinned | None = None

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
    reason: str = Reason.TURN_END  # PRESSURE: a pin let go (the wait keeps its start)
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


Mode = Literal["adaptive", "park", "pin"]
Answer = Literal["pinned", "parked", "dropped"]


@dataclass(frozen=True)
class TurnEndRule:
    """The settings the rule reads ([vllm] turn_end, pin_ttl_s, pin_margin, pin_share)."""

    mode: Mode = "adaptive"
    pin_ttl_s: float = 30.0
    pin_margin: float = 2.0
    pin_share: float = 0.25


@dataclass(frozen=True)
class TurnEndFacts:
    """What is known at the turn end, under the session's lock."""

    expected_s: float | None  # the expected pause (given, learned per tool, or global)
    expected_source: str  # where that figure comes from, for the reason
    tokens: int  # the session's tokens (what a drop recomputes)
    blocks: int  # its whole blocks in vLLM's pool (what a pin holds, a park copies)
    block_bytes: int
    bandwidth_bps: float  # the measured copy bandwidth (host pool <-> vLLM)
    overhead_s: float  # a copy's fixed cost (policy.overhead_s)
    prefill_ms_per_token: float | None  # measured by the connector; None: not yet
    engine_free_blocks: int | None  # vLLM's free blocks at the turn end; None: unknown
    engine_total_blocks: int | None  # vLLM's KV cache in blocks; None: unknown (no pin)
    pinned_blocks: int  # blocks pinned now (before this turn)
    host_room: bool  # the host pool can take the copy
    pressure: bool = False  # a pin being let go: park or drop, never pin
    backs_pins: bool = False  # the connector copies a pinned turn behind its pin (protocol 5)


@dataclass(frozen=True)
class TurnEndChoice:
    answer: Answer
    why: str
    pin_ttl_s: float | None = None  # pinned only
    expected_s: float | None = None  # the expected pause it assumed
    backed: bool = False  # pinned with a parked copy behind it (a release frees at once)


Chooser = Callable[[TurnEndFacts, TurnEndRule], TurnEndChoice]


@dataclass(frozen=True)
class TurnEndAsk:
    """What the connector says of vLLM's pool at a turn end (protocol 4), with the rule
    that answers it (agentpark.policy.turn_end.choose, handed in: policy sits above)."""

    rule: TurnEndRule
    choose: Chooser
    engine_free_blocks: int | None = None
    engine_total_blocks: int | None = None
    pinned_blocks: int = 0
    pressure: bool = False
    prefill_ms_per_token: float | None = None
    overhead_s: float = 0.001  # policy.overhead_s
    quantile: float = 0.5  # policy.tool_quantile, for the global pause
    backs_pins: bool = False  # the connector copies a pinned turn behind its pin (protocol 5)

    @property
    def active(self) -> bool:
        """Whether the rule answers (else park or keep as before): not ``park`` mode, and
        the connector said how large vLLM's pool is (a protocol-4 connector)."""
        return self.rule.mode != "park" and self.engine_total_blocks is not None


@dataclass(frozen=True)
class Pinned:
    """A turn pinned: vLLM keeps its blocks allocated for ``ttl_s`` at the latest."""

    row: SessionRow
    why: str
    expected_s: float | None
    ttl_s: float
