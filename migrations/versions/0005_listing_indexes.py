"""Indexes for listing in order: sessions by (tenant, seq), events by (tenant, id)

Without them a page of sessions or of a tenant's newest events sorts every row of the
tenant first, so the cost of a listing grew with the number of sessions or events.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_sessions_tenant_seq", "sessions", ["tenant", "seq"])
    op.create_index("ix_events_tenant_id", "events", ["tenant", "id"])


def downgrade() -> None:
    op.drop_index("ix_events_tenant_id", table_name="events")
    op.drop_index("ix_sessions_tenant_seq", table_name="sessions")
