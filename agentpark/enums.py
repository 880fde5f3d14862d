"""The words of the session core, one enum each: states, tiers, reasons, event kinds.

They are ``StrEnum``s, so they compare equal to the strings stored in SQLite and sent
over the API, and every other module names them from here instead of spelling a literal.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "PARKING_TIERS",
    "Decision",
    "EventKind",
    "Medium",
    "Reason",
    "RestoredFrom",
    "State",
    "Tier",
    "TierChoice",
]


class State(StrEnum):
    """Where a session is in its life cycle (the state machine in docs/ARCHITECTURE.md)."""

    ACTIVE = "active"
    PAUSING = "pausing"
    PARKED = "parked"
    RESUMING = "resuming"
    RECOMPUTING = "recomputing"
    LOST = "lost"
    DELETED = "deleted"


class Tier(StrEnum):
    """A host tier a parked copy can live in, fastest first (the auto order)."""

    DRAM = "dram"
    SHM = "shm"
    DISK = "disk"


PARKING_TIERS: tuple[Tier, ...] = (Tier.DRAM, Tier.SHM, Tier.DISK)
"""Every tier, in the order ``tier=auto`` tries them and demotion walks them."""


class TierChoice(StrEnum):
    """What a caller may ask a pause for: a tier, or ``auto`` (the first with room)."""

    AUTO = "auto"
    DRAM = "dram"
    SHM = "shm"
    DISK = "disk"


class Medium(StrEnum):
    """What holds blocks, for the mover's choice of copy handler."""

    POOL = "pool"  # an engine's pool, reached only through a DMA backend
    HOST = "host"  # numpy buffers in the pool's layout: tiers, host-resident pools


class Decision(StrEnum):
    """What a pause did: the advisor parks a session, or keeps a short pause in the pool;
    or the park was tried and did not happen (the copy failed, the plan was unknown)."""

    PARKED = "parked"
    KEPT = "kept"
    NOT_PARKED = "not_parked"
    PINNED = "pinned"  # vLLM: the blocks stay allocated (a delayed free) until a pin ends
    DROPPED = "dropped"  # vLLM: the blocks are freed now; the next turn recomputes


class RestoredFrom(StrEnum):
    """Where a resume found the session's KV."""

    POOL = "pool"  # it was active already (kept, or prefetched)
    DRAM = "dram"
    SHM = "shm"
    DISK = "disk"
    RECOMPUTE = "recompute"  # the copy was gone or damaged: re-prefilled from the token log


class Reason(StrEnum):
    """Why a transition happened (``events.reason``)."""

    EXPLICIT = "explicit"  # an API call
    TURN_END = "turn_end"  # an external engine's turn ended (vLLM's connector)
    IDLE = "idle"
    PRESSURE = "pressure"
    PREFETCH = "prefetch"
    DEMOTE = "demote"
    DRAIN = "drain"
    RESTART = "restart"
    GENERATE = "generate"  # a generate on a parked session brought it back
    BREAK_EVEN = "break_even"  # kept: the pause is too short to be worth parking
    CHECKSUM = "checksum"
    TIER_FILE_MISSING = "tier_file_missing"  # a tier file removed or replaced while running
    TTL = "ttl"  # a parked copy untouched for policy.parked_ttl_s was dropped
    CONTENT = "content"  # parked blocks found by content (another session's) served it
    ANONYMOUS = "anonymous"  # an unnamed conversation's copy: superseded, over its share, TTL
    RETURN = "return"  # a pin ended: the session's next request came
    TIMEOUT = "timeout"  # a pin ended: its time-out passed
    SHUTDOWN = "shutdown"  # a pin ended: the engine stopped
    EXPIRED = "expired"  # a pin's record ended past its time-out with no word from the engine
    PIN_COPY = "pin_copy"  # a pinned turn's parked copy, taken behind the pin (protocol 5)


class EventKind(StrEnum):
    """What an event records (``events.kind``)."""

    CREATE = "create"
    ADOPT = "adopt"  # an engine handed a new session KV it computed itself
    GENERATE = "generate"
    TURN = "turn"  # an external engine reported a turn's tokens and blocks
    KEEP = "keep"
    PIN = "pin"  # vLLM kept a turn's blocks allocated (until its next request or a time-out)
    UNPIN = "unpin"  # such a pin ended (its reason: return, timeout, pressure, ...)
    DROP = "drop"  # vLLM freed a turn's blocks without a copy
    PAUSE = "pause"
    RESUME = "resume"
    RECOMPUTE = "recompute"
    MOVE = "move"
    TOOL_RETURN = "tool_return"
    CORRUPT = "corrupt"
    LOST = "lost"
    DELETE = "delete"
    PAUSE_FAILED = "pause_failed"
    RESTORE_FAILED = "restore_failed"
    MOVE_FAILED = "move_failed"
    MOVED_OUT = "moved_out"  # handed to another daemon (detail names it): gone from here
    MOVED_IN = "moved_in"  # taken over from another daemon, parked here
