"""Schema changes go through alembic only; this runs them from code and the CLI."""

from __future__ import annotations

from importlib import resources

from alembic import command
from alembic.config import Config

__all__ = ["alembic_config", "upgrade"]


def alembic_config(url: str) -> Config:
    """An alembic Config for the migrations shipped with the package (migrations/)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("agentpark.migrations")))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["configure_logger"] = False
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (creating the file if needed)."""
    from agentpark.store.db import open_database

    engine, _ = open_database(url)
    with engine.connect():  # makes the folder and switches the file to WAL (persistent)
        pass
    engine.dispose()
    command.upgrade(alembic_config(url), revision)
