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
            assert context.get_current_revision() == "0008"
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
            assert MigrationContext.configure(conn).get_current_revision() == "0008"
    finally:
        engine.dispose()
