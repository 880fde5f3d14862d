"""The host snapshot: what one daemon holds right now, as one typed value.

The session core builds it; ``GET /v1/host`` returns it, the metrics collector, the
history sampler, ``agentpark status`` and the dashboard read it. One model, so a figure
means the same thing everywhere and a client parses it with the same class.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from agentpark.enums import State

__all__ = ["Counters", "HostSnapshot", "PinFigures", "PoolFigures", "TierFigures"]


class PoolFigures(BaseModel):
    """The engine's paged KV pool (HBM on an accelerator)."""

    total_blocks: int
    used_blocks: int
    free_blocks: int
    block_size_tokens: int
    block_bytes: int
    total_bytes: int
    used_bytes: int
    free_bytes: int


class TierFigures(BaseModel):
    """One host tier's capacity and use."""

    persistent: bool = Field(description="survives a daemon restart (shm, disk)")
    capacity_blocks: int
    used_blocks: int
    capacity_bytes: int
    used_bytes: int


class Counters(BaseModel):
    """Since this daemon started; the durable history is the events table."""

    pauses: int = 0
    resumes: int = 0
    recomputes: int = 0
    bytes_parked: int = 0
    bytes_restored: int = 0
    tokens_generated: int = 0
    prefill_tokens_avoided: int = Field(0, description="tokens an engine did not recompute")


class PinFigures(BaseModel):
    """vLLM's pins (a turn's blocks kept allocated until the session's next request): now,
    and since this daemon started (a restart forgets pins: the connector frees them)."""

    sessions: int = Field(0, description="sessions pinned now")
    blocks: int = Field(0, description="vLLM blocks they hold")
    released: dict[str, int] = Field(
        default_factory=dict,
        description="pins ended, by cause: return, timeout, pressure, shutdown, restart, "
        "expired (no word from the connector past the time-out)",
    )
    tokens_saved: int = Field(0, description="prefill tokens vLLM served from pinned blocks")
    bytes_saved: int = Field(0, description="those tokens' whole blocks, in bytes")
    turn_ends: dict[str, int] = Field(
        default_factory=dict,
        description="turn ends by answer: pinned, parked, dropped, kept",
    )


def _no_sessions() -> dict[str, int]:
    return {s.value: 0 for s in State if s is not State.DELETED}


class HostSnapshot(BaseModel):
    """Pool totals, HBM reclaimed by parking, tier use, sessions by state, counters."""

    ready: bool = Field(description="the engine is warm (/readyz)")
    model_uid: str
    dma_backend: str
    listen: str = Field(description="host:port the daemon was configured to bind")
    pool: PoolFigures
    reclaimed_bytes: int = Field(description="bytes of parked sessions' KV off the pool")
    tiers: dict[str, TierFigures]
    sessions: dict[str, int] = Field(
        default_factory=_no_sessions, description="live sessions by state"
    )
    draining: bool
    counters: Counters
    active_tokens: int = Field(
        0, description="tokens of the active sessions' KV in the engine (vLLM: their last turns)"
    )
    oldest_parked_s: float | None = Field(
        None,
        description="seconds since the longest-untouched parked session's last turn (what "
        "policy.parked_ttl_s counts); null: nothing parked",
    )
    degraded: dict[str, int] | None = Field(
        None,
        description="vLLM mode: requests connectors served without agentpark since start, "
        "by cause (slow: the answer came after the connector's budget); null: no vLLM",
    )
    pins: PinFigures | None = Field(
        None, description="vLLM mode: pins now and since start; null: no vLLM"
    )
