"""What happened to an engine request: its turn, read from the events that name it.

``GET /v1/requests/{id}`` and ``GET /v1/sessions/{id}/turns`` answer these. A turn is
every event one engine request (vLLM's ``request_id``) caused: its start (a restore of
the parked copy, or a recompute) and its end (parked, kept in the pool, or not parked).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field

from agentpark.enums import RestoredFrom, Tier
from agentpark.schemas.sessions import EventOut

__all__ = ["TurnDecision", "TurnOut", "TurnPage"]


class TurnDecision(StrEnum):
    """What agentpark did with the request's KV: at its end when it has ended, else at
    its start."""

    PARKED = "parked"  # copied into a host tier at the turn's end; the pool let it go
    KEPT = "kept"  # left in the engine's pool (a short pause, or nothing to park)
    PINNED = "pinned"  # vLLM kept its blocks allocated for the session's next request
    DROPPED = "dropped"  # vLLM freed its blocks with no copy (cheaper to recompute)
    NOT_PARKED = "not_parked"  # the park was tried and failed; the KV stayed in the pool
    RESTORED = "restored"  # the parked prefix was loaded into the engine
    RECOMPUTED = "recomputed"  # the parked copy was gone or damaged; the engine prefilled
    RESTORE_FAILED = "restore_failed"  # the load failed; the engine prefilled, copy kept
    RECORDED = "recorded"  # only the turn's tokens were recorded (nothing moved)


class TurnOut(BaseModel):
    request_id: str = Field(description="the engine's id of the request (vLLM's, suffix and all)")
    session_id: str
    started_at: datetime = Field(description="its first event")
    ended_at: datetime = Field(description="its last event")
    ended: bool = Field(
        description="the turn's end (parked, kept or not_parked) is recorded; false while "
        "the engine still runs or copies it"
    )
    decision: TurnDecision
    why: str | None = Field(description="the reason recorded with the decision")
    restored_tokens: int = Field(description="prefix tokens loaded from a parked copy")
    restored_from: RestoredFrom | None = Field(
        description="where those tokens came from (recompute: the copy was unusable)"
    )
    restore_ms: float | None = Field(description="time the restore took")
    restore_bytes: int | None = Field(description="bytes loaded into the engine")
    parked_tier: Tier | None = Field(description="the tier the turn's end parked into")
    park_ms: float | None = Field(description="time the park took")
    park_bytes: int | None = Field(description="bytes the park copied")
    tool: str | None = Field(description="the tool the agent waits on, as the park recorded")
    tokens: int | None = Field(description="the session's tokens at the turn's end")
    events: list[EventOut] = Field(description="the events of the request, oldest first")


class TurnPage(BaseModel):
    turns: list[TurnOut] = Field(description="newest first")
