"""The schema comes only from alembic, and the models match it exactly."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from agentpark.store.migrate import upgrade
from agentpark.store.models import Base


def test_upgrade_head_on_an_empty_file_makes_the_schema_the_models_describe(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'fresh' / 'agentpark.db'}"
    upgrade(url)
    engine = create_engine(url)
    try:
        tables = set(inspect(engine).get_table_names())
        assert {"sessions", "events", "alembic_version"} <= tables
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert context.get_current_revision() == "0009"
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_upgrade_is_idempotent(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentpark.db'}"
    upgrade(url)
    upgrade(url)
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            assert MigrationContext.configure(conn).get_current_revision() == "0009"
    finally:
        engine.dispose()


def test_0008_keeps_existing_events_with_no_request_and_downgrades(tmp_path: Path) -> None:
    from alembic import command

    from agentpark.store.migrate import alembic_config

    url = f"sqlite:///{tmp_path / 'agentpark.db'}"
    upgrade(url, "0007")
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO sessions (seq, session_id, tenant, state, num_tokens, kv_blocks, "
                "kv_bytes, created_at, last_active_at, pause_count, metadata, token_log) "
                "VALUES (1, 's', 't', 'active', 0, 0, 0, 1.0, 1.0, 0, '{}', x'')"
            )
            conn.exec_driver_sql(
                "INSERT INTO events (session_seq, tenant, session_id, kind, at) "
                "VALUES (1, 't', 's', 'create', 1.0)"
            )
        upgrade(url)
        with engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT kind, request_id FROM events").all()
            assert [tuple(r) for r in rows] == [("create", None)]
            indexes = {i["name"]: i["column_names"] for i in inspect(conn).get_indexes("events")}
            assert indexes["ix_events_tenant_request"] == ["tenant", "request_id", "id"]
        command.downgrade(alembic_config(url), "0007")
        with engine.connect() as conn:
            columns = {c["name"] for c in inspect(conn).get_columns("events")}
            assert "request_id" not in columns
            assert conn.exec_driver_sql("SELECT count(*) FROM events").scalar() == 1
    finally:
        engine.dispose()
