"""SQLAlchemy 2.0 models: the schema the alembic migrations create, and nothing else.

Times are UTC epoch seconds (REAL): unambiguous in SQLite and cheap for policy math.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = ["ApiTokenRow", "Base", "EventRow", "HostSampleRow", "MoveRow", "SessionRow"]


class Base(DeclarativeBase):
    pass


class SessionRow(Base):
    """One agent session; the row outlives the session (state 'deleted') as history."""

    __tablename__ = "sessions"
    __table_args__ = (
        UniqueConstraint("tenant", "session_id", name="uq_sessions_tenant_session_id"),
        Index("ix_sessions_tenant_state", "tenant", "state"),
        Index("ix_sessions_tenant_seq", "tenant", "seq"),
        # Retention: deleted sessions by the time of their delete.
        Index("ix_sessions_state_deleted_at", "state", "deleted_at"),
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(String(128))
    tenant: Mapped[str] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16))
    tier: Mapped[str | None] = mapped_column(String(16))
    num_tokens: Mapped[int] = mapped_column(Integer, default=0)
    kv_blocks: Mapped[int] = mapped_column(Integer, default=0)
    kv_bytes: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    last_active_at: Mapped[float] = mapped_column(Float)
    paused_at: Mapped[float | None] = mapped_column(Float)
    pause_count: Mapped[int] = mapped_column(Integer, default=0)
    tool: Mapped[str | None] = mapped_column(String(128))
    expected_resume_at: Mapped[float | None] = mapped_column(Float)
    # When the parked copy entered its current tier: demotion by age counts from here.
    tier_since: Mapped[float | None] = mapped_column(Float)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    # int32 little-endian token ids: the log a lost session is recomputed from.
    token_log: Mapped[bytes] = mapped_column(LargeBinary, default=b"")
    # float32 logits for the next token, so a resumed session continues without a step.
    next_logits: Mapped[bytes | None] = mapped_column(LargeBinary)
    # Where the parked copy lives, e.g. {"slots": [3, 4]}; null when not parked.
    parked_handle: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    checksum: Mapped[str | None] = mapped_column(String(64))
    lost_reason: Mapped[str | None] = mapped_column(String(256))
    deleted_at: Mapped[float | None] = mapped_column(Float)


class EventRow(Base):
    """One state transition, with what it cost."""

    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_tenant_session", "tenant", "session_id", "id"),
        Index("ix_events_tenant_id", "tenant", "id"),
        # Retention prunes each kind by age; /v1/host/latency sums kinds over a window from
        # the index alone (it covers the durations and bytes too).
        Index("ix_events_kind_at", "kind", "at", "duration_ms", "bytes"),
        # The newest tool_return events of each tool (learned pauses) without a scan.
        Index("ix_events_kind_detail_id", "kind", "detail", "id"),
        # Purging a session finds its events (and SQLite's SET NULL action does) by key.
        Index("ix_events_session_seq", "session_seq"),
        # "What happened to this request": its events by the engine's request id.
        Index("ix_events_tenant_request", "tenant", "request_id", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # Null once the session's row is purged (retention.deleted_h): its tool returns stay.
    session_seq: Mapped[int | None] = mapped_column(ForeignKey("sessions.seq", ondelete="SET NULL"))
    tenant: Mapped[str] = mapped_column(String(128))
    session_id: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(32))
    at: Mapped[float] = mapped_column(Float, index=True)
    duration_ms: Mapped[float | None] = mapped_column(Float)
    bytes: Mapped[int | None] = mapped_column(Integer)
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str | None] = mapped_column(String(16))
    from_tier: Mapped[str | None] = mapped_column(String(16))
    to_tier: Mapped[str | None] = mapped_column(String(16))
    # Why: explicit (an API call), idle, pressure, drain, prefetch, demote, restart, ...
    reason: Mapped[str | None] = mapped_column(String(32))
    detail: Mapped[str | None] = mapped_column(String(1024))
    # The engine's id of the request whose turn this event is part of (vLLM's
    # request_id); null for the daemon's own work and for REST callers.
    request_id: Mapped[str | None] = mapped_column(String(256))


class HostSampleRow(Base):
    """One point of the host's history (/v1/host/history, the dashboard).

    Gauges (pool, reclaimed, tiers, sessions) are what the host held at ``at``; the
    counts, bytes and milliseconds are of the events committed since the previous sample
    (event ids up to ``last_event_id``). A downsampled row stands for ``n`` raw samples of
    the bucket ``[at, at + step_s)``: gauges averaged, counts summed, p50 the count-weighted
    mean and p99 the maximum of its members.
    """

    __tablename__ = "host_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    # Seconds a raw sample covers (the sampling interval) or the bucket width.
    step_s: Mapped[float] = mapped_column(Float)
    n: Mapped[int] = mapped_column(Integer, default=1)
    last_event_id: Mapped[int] = mapped_column(Integer, default=0)
    pool_total_bytes: Mapped[int] = mapped_column(Integer)
    pool_used_bytes: Mapped[int] = mapped_column(Integer)
    reclaimed_bytes: Mapped[int] = mapped_column(Integer)
    # {tier: {"used_bytes": int, "capacity_bytes": int}}
    tiers: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # {state: count}; averages (floats) in downsampled rows
    sessions: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    pauses: Mapped[int] = mapped_column(Integer, default=0)
    resumes: Mapped[int] = mapped_column(Integer, default=0)
    recomputes: Mapped[int] = mapped_column(Integer, default=0)
    restore_failures: Mapped[int] = mapped_column(Integer, default=0)
    bytes_parked: Mapped[int] = mapped_column(Integer, default=0)
    bytes_restored: Mapped[int] = mapped_column(Integer, default=0)
    # Milliseconds spent copying those bytes: bandwidth = bytes / (ms / 1000).
    park_ms: Mapped[float] = mapped_column(Float, default=0.0)
    restore_ms: Mapped[float] = mapped_column(Float, default=0.0)
    pause_p50_ms: Mapped[float | None] = mapped_column(Float)
    pause_p99_ms: Mapped[float | None] = mapped_column(Float)
    resume_p50_ms: Mapped[float | None] = mapped_column(Float)
    resume_p99_ms: Mapped[float | None] = mapped_column(Float)


class ApiTokenRow(Base):
    """One bearer token (agentpark.auth): its id, tenant and scopes, and only a hash of it.

    The row outlives a revocation (``revoked_at`` set) so ``agentpark token list`` shows it
    and an import can never bring it back.
    """

    __tablename__ = "api_tokens"

    # The public part of the token (``apk_<id>_<secret>``): listable, not a secret.
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    # Comma-separated, sorted: e.g. "operator,sessions".
    scopes: Mapped[str] = mapped_column(String(64))
    # SHA-256 (hex) of the whole token string.
    token_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)
    last_used_at: Mapped[float | None] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float)


class MoveRow(Base):
    """A session this daemon is handing to another (agentpark.moving): the source's record.

    Written (``sending``) before the first byte goes out and closed (``done``) in the
    write after the session was dropped here. A ``sending`` row whose session is still
    parked here is in doubt: the target may have committed it, so this daemon does not
    serve it until the move is run again and the target says which.
    """

    __tablename__ = "moves"
    __table_args__ = (Index("ix_moves_state", "state"),)

    move_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    session_id: Mapped[str] = mapped_column(String(128))
    peer: Mapped[str] = mapped_column(String(512))
    state: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
