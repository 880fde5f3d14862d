"""sessions and events

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("tier", sa.String(16), nullable=True),
        sa.Column("num_tokens", sa.Integer(), nullable=False),
        sa.Column("kv_blocks", sa.Integer(), nullable=False),
        sa.Column("kv_bytes", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("last_active_at", sa.Float(), nullable=False),
        sa.Column("paused_at", sa.Float(), nullable=True),
        sa.Column("pause_count", sa.Integer(), nullable=False),
        sa.Column("tool", sa.String(128), nullable=True),
        sa.Column("expected_resume_at", sa.Float(), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("token_log", sa.LargeBinary(), nullable=False),
        sa.Column("next_logits", sa.LargeBinary(), nullable=True),
        sa.Column("parked_handle", sa.JSON(), nullable=True),
        sa.Column("checksum", sa.String(64), nullable=True),
        sa.Column("lost_reason", sa.String(256), nullable=True),
        sa.Column("deleted_at", sa.Float(), nullable=True),
        sa.UniqueConstraint("tenant", "session_id", name="uq_sessions_tenant_session_id"),
    )
    op.create_index("ix_sessions_tenant_state", "sessions", ["tenant", "state"])
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "session_seq",
            sa.Integer(),
            sa.ForeignKey("sessions.seq", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=True),
        sa.Column("bytes", sa.Integer(), nullable=True),
        sa.Column("from_state", sa.String(16), nullable=True),
        sa.Column("to_state", sa.String(16), nullable=True),
        sa.Column("from_tier", sa.String(16), nullable=True),
        sa.Column("to_tier", sa.String(16), nullable=True),
        sa.Column("detail", sa.String(1024), nullable=True),
    )
    op.create_index("ix_events_tenant_session", "events", ["tenant", "session_id", "id"])
    op.create_index("ix_events_at", "events", ["at"])


def downgrade() -> None:
    op.drop_index("ix_events_at", table_name="events")
    op.drop_index("ix_events_tenant_session", table_name="events")
    op.drop_table("events")
    op.drop_index("ix_sessions_tenant_state", table_name="sessions")
    op.drop_table("sessions")
