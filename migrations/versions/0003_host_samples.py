"""host_samples: the host's history for the dashboard and /v1/host/history

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "host_samples",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("step_s", sa.Float(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("last_event_id", sa.Integer(), nullable=False),
        sa.Column("pool_total_bytes", sa.Integer(), nullable=False),
        sa.Column("pool_used_bytes", sa.Integer(), nullable=False),
        sa.Column("reclaimed_bytes", sa.Integer(), nullable=False),
        sa.Column("tiers", sa.JSON(), nullable=False),
        sa.Column("sessions", sa.JSON(), nullable=False),
        sa.Column("pauses", sa.Integer(), nullable=False),
        sa.Column("resumes", sa.Integer(), nullable=False),
        sa.Column("recomputes", sa.Integer(), nullable=False),
        sa.Column("restore_failures", sa.Integer(), nullable=False),
        sa.Column("bytes_parked", sa.Integer(), nullable=False),
        sa.Column("bytes_restored", sa.Integer(), nullable=False),
        sa.Column("park_ms", sa.Float(), nullable=False),
        sa.Column("restore_ms", sa.Float(), nullable=False),
        sa.Column("pause_p50_ms", sa.Float(), nullable=True),
        sa.Column("pause_p99_ms", sa.Float(), nullable=True),
        sa.Column("resume_p50_ms", sa.Float(), nullable=True),
        sa.Column("resume_p99_ms", sa.Float(), nullable=True),
    )
    op.create_index("ix_host_samples_at", "host_samples", ["at"])


def downgrade() -> None:
    op.drop_index("ix_host_samples_at", table_name="host_samples")
    op.drop_table("host_samples")
