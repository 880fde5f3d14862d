"""Alembic migrations, installed as the package ``agentpark.migrations``."""
