"""Sessions handed to another daemon: the source's hand-over record, ``moves``

A row per move this daemon started (agentpark.moving): ``sending`` until the target
committed the session and this daemon dropped it (``done``). At start, a ``sending`` row
whose session is still parked here marks the session in doubt (see agentpark.moving.record).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "moves",
        sa.Column("move_id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("peer", sa.String(512), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
    )
    op.create_index("ix_moves_state", "moves", ["state"])


def downgrade() -> None:
    op.drop_index("ix_moves_state", table_name="moves")
    op.drop_table("moves")
