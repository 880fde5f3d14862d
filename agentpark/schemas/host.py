"""Response bodies of the host, dashboard, admin and health routes.

``GET /v1/host`` answers :class:`agentpark.snapshot.HostSnapshot` itself; the rest are
here. Like :mod:`agentpark.schemas.sessions`, wire models only: nothing from the store or the
session core.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from agentpark.config import PolicySettings
from agentpark.enums import Tier
from agentpark.snapshot import HostSnapshot

__all__ = [
    "HistoryResponse",
    "HistorySample",
    "LatencyResponse",
    "LivenessResponse",
    "ParkedPage",
    "ParkedSession",
    "PeerHost",
    "PeerSample",
    "PeersResponse",
    "PolicyResponse",
    "ReadinessResponse",
    "ReloadResponse",
    "ToolEstimate",
    "TransferLatency",
]


# ---- health -------------------------------------------------------------------------------


class LivenessResponse(BaseModel):
    status: Literal["ok"] = "ok"


class ReadinessResponse(BaseModel):
    status: Literal["ready"] = "ready"


# ---- admin --------------------------------------------------------------------------------


class ReloadResponse(BaseModel):
    reloaded: bool = Field(description="always true: a refused file answers 422 instead")
    policy: PolicySettings = Field(description="the policy now in force")


class ToolEstimate(BaseModel):
    expected_s: float | None = Field(
        description="the pause the policy expects for this tool: learned, else the prior"
    )
    observed: int = Field(description="pauses of this tool seen since the daemon started")


class PolicyResponse(BaseModel):
    policy: PolicySettings = Field(description="the policy in force")
    bandwidth_bps: float = Field(description="measured park bandwidth (moving average), B/s")
    tools: dict[str, ToolEstimate] = Field(description="by tool name, every tool seen")


# ---- history --------------------------------------------------------------------------------


class HistorySample(BaseModel):
    """One point of the host's history; a merged point stands for ``n`` raw samples.

    Gauges (pool, reclaimed, tiers, sessions) are what the host held at ``at`` (averaged
    in a merged point); counts, bytes and latencies are of the events since the point
    before (summed; p50 the count-weighted mean, p99 the maximum: a bound).
    """

    at: float = Field(description="epoch seconds; a merged point's bucket start")
    step_s: float = Field(description="seconds this point covers")
    n: int = Field(description="raw samples this point stands for")
    pool_total_bytes: int
    pool_used_bytes: int
    reclaimed_bytes: int = Field(description="parked sessions' KV off the pool")
    tiers: dict[str, dict[str, int]] = Field(
        description="by tier: used_bytes and capacity_bytes (a tier seen in part of a "
        "merged point has the figures it had)"
    )
    sessions: dict[str, int | float] = Field(
        description="live sessions by state; averages in a merged point"
    )
    pauses: int
    resumes: int
    recomputes: int
    restore_failures: int
    bytes_parked: int
    bytes_restored: int
    park_bytes_per_s: float | None = Field(description="null when nothing was parked")
    restore_bytes_per_s: float | None = Field(description="null when nothing was restored")
    pause_p50_ms: float | None
    pause_p99_ms: float | None
    resume_p50_ms: float | None = Field(description="copies back and recomputes")
    resume_p99_ms: float | None


class HistoryResponse(BaseModel):
    host: str = Field(description="this daemon's host label")
    now: float = Field(description="epoch seconds when the daemon answered")
    since: float = Field(description="start of the window, epoch seconds")
    until: float = Field(description="end of the window, epoch seconds")
    interval_s: float = Field(description="dashboard.sample_interval_s")
    refresh_s: float = Field(description="dashboard.refresh_s: how often the page reloads")
    retention_h: float = Field(description="dashboard.retention_h")
    step_s: float = Field(description="seconds per point of this answer")
    samples: list[HistorySample] = Field(description="oldest first")


# ---- latency --------------------------------------------------------------------------------


class TransferLatency(BaseModel):
    count: int = Field(description="pauses; for resume, copies back and recomputes")
    p50_ms: float | None = Field(description="null when there were none")
    p99_ms: float | None
    bytes: int = Field(description="bytes copied")
    bytes_per_s: float | None = Field(description="while copying; null when nothing copied")


class LatencyResponse(BaseModel):
    window_s: float
    since: float = Field(description="epoch seconds")
    until: float = Field(description="epoch seconds (now)")
    pause: TransferLatency
    resume: TransferLatency
    recomputes: int = Field(description="resumes that re-prefilled from the token log")
    restore_failures: int = Field(description="copies back that failed (then recomputed)")


# ---- parked sessions ------------------------------------------------------------------------


class ParkedSession(BaseModel):
    tenant: str
    session_id: str
    tier: Tier | None = Field(description="the tier holding the parked copy")
    kv_bytes: int
    kv_blocks: int
    num_tokens: int
    paused_at: float | None = Field(description="epoch seconds")
    tool: str | None = Field(description="the tool the agent is running")
    expected_resume_at: float | None = Field(description="epoch seconds")


class ParkedPage(BaseModel):
    count: int = Field(description="parked sessions, every tenant (not only those listed)")
    bytes: int = Field(description="their KV bytes, all of them")
    sessions: list[ParkedSession] = Field(description="the largest, largest first")


# ---- peers ----------------------------------------------------------------------------------


class PeerSample(BaseModel):
    """The fields of a history sample the per-host chart uses."""

    at: float
    step_s: float
    reclaimed_bytes: int
    pool_used_bytes: int
    pool_total_bytes: int


class PeerHost(BaseModel):
    """This daemon or one peer; a peer that does not answer is down, with no figures."""

    name: str = Field(description="host label (from the peer's history), else host:port")
    url: str | None = Field(description="the peer's base URL; null for this daemon")
    self: bool = Field(description="this entry is the daemon that answered")
    up: bool
    error: str | None = Field(description="why the peer is down")
    host: HostSnapshot | None = Field(description="its /v1/host; null when down")
    history: list[PeerSample] | None = Field(description="null when down or unreadable")
    history_error: str | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="present when the peer is up but its history could not be read",
    )


class PeersResponse(BaseModel):
    timeout_s: float = Field(description="dashboard.peer_timeout_s")
    hosts: list[PeerHost] = Field(description="this daemon first, then dashboard.peers")
