"""Bearer tokens: api_tokens (id, tenant, scopes, SHA-256 of the token, times)

The token itself is never stored: only its SHA-256, which is enough for 256-bit random
secrets (see agentpark.auth). Revoked rows stay, so a revocation is never undone.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("scopes", sa.String(64), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("last_used_at", sa.Float(), nullable=True),
        sa.Column("revoked_at", sa.Float(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("api_tokens")
