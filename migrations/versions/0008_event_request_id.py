"""Events name their request: ``events.request_id`` and its (tenant, request_id) index

An external engine (vLLM's connector) names the request each operation serves; the
events it causes carry that id, so ``GET /v1/requests/{id}`` and a session's turns are
read from the event log alone. Existing events keep a null id (they named none).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("events", sa.Column("request_id", sa.String(256), nullable=True))
    op.create_index("ix_events_tenant_request", "events", ["tenant", "request_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_events_tenant_request", table_name="events")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("request_id")
