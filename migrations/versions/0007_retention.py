"""Retention: indexes to prune by age and read tool pauses without a scan; purgeable sessions

- ``ix_events_kind_at`` (kind, at, duration_ms, bytes): pruning each event kind by age, and
  /v1/host/latency's sums and percentiles over a window, read an index range instead of
  the table (the index covers what the latency figures need).
- ``ix_events_kind_detail_id``: the newest tool_return events of each tool come from the
  index, so loading the learned pauses costs the same at 1k or 1M rows.
- ``ix_events_session_seq``: a purged session's events, found by key (SQLite's own
  ``SET NULL`` action looks them up the same way).
- ``ix_sessions_state_deleted_at``: deleted sessions due for their purge.
- ``events.session_seq`` becomes nullable with ``ON DELETE SET NULL`` (was CASCADE): a
  purged session's tool returns outlive its row. SQLite cannot alter a foreign key, so the
  table is rebuilt (one copy of the events, at upgrade time only).

Revision ID: 0007
Revises: 0005
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    "id, session_seq, tenant, session_id, kind, at, duration_ms, bytes, from_state, "
    "to_state, from_tier, to_tier, detail, reason"
)
_OLD_INDEXES = (
    ("ix_events_tenant_session", ["tenant", "session_id", "id"]),
    ("ix_events_at", ["at"]),
    ("ix_events_tenant_id", ["tenant", "id"]),
)


def _events_table(name: str, *, ondelete: str, nullable: bool) -> None:
    op.create_table(
        name,
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "session_seq",
            sa.Integer(),
            sa.ForeignKey("sessions.seq", ondelete=ondelete),
            nullable=nullable,
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
        sa.Column("reason", sa.String(32), nullable=True),
    )


def _rebuild_events(*, ondelete: str, nullable: bool, where: str = "") -> None:
    _events_table("events_rebuilt", ondelete=ondelete, nullable=nullable)
    op.execute(f"INSERT INTO events_rebuilt ({_COLUMNS}) SELECT {_COLUMNS} FROM events {where}")
    for name, _ in _OLD_INDEXES:
        op.drop_index(name, table_name="events")
    op.drop_table("events")
    op.rename_table("events_rebuilt", "events")
    for name, columns in _OLD_INDEXES:
        op.create_index(name, "events", columns)


def upgrade() -> None:
    _rebuild_events(ondelete="SET NULL", nullable=True)
    op.create_index("ix_events_kind_at", "events", ["kind", "at", "duration_ms", "bytes"])
    op.create_index("ix_events_kind_detail_id", "events", ["kind", "detail", "id"])
    op.create_index("ix_events_session_seq", "events", ["session_seq"])
    op.create_index("ix_sessions_state_deleted_at", "sessions", ["state", "deleted_at"])


def downgrade() -> None:
    op.drop_index("ix_sessions_state_deleted_at", table_name="sessions")
    op.drop_index("ix_events_session_seq", table_name="events")
    op.drop_index("ix_events_kind_detail_id", table_name="events")
    op.drop_index("ix_events_kind_at", table_name="events")
    # Events of purged sessions have no row to point at under the old NOT NULL key.
    _rebuild_events(ondelete="CASCADE", nullable=False, where="WHERE session_seq IS NOT NULL")
