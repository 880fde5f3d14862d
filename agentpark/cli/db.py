"""``agentpark db upgrade | cleanup``: the state dir's database and leftover tier files,
worked on directly, whether a daemon runs on them or not."""

from __future__ import annotations

import argparse
from pathlib import Path

from agentpark.cli.common import Commands, Subparsers, settings_of
from agentpark.config import load_settings

__all__ = ["add_db_commands", "db_cleanup", "db_upgrade"]


def add_db_commands(commands: Commands, sub: Subparsers[argparse.ArgumentParser]) -> None:
    db_sub = commands.group(sub, "db", "db commands", help="database maintenance")
    db_up = commands.add(db_sub, "upgrade", help="apply alembic migrations up to head")
    db_up.set_defaults(run=db_upgrade)
    db_clean = commands.add(
        db_sub,
        "cleanup",
        help="list moved-aside and orphaned tier files (shm, disk) and remove them",
    )
    db_clean.add_argument("--dry-run", action="store_true", help="list only")
    db_clean.add_argument("--yes", action="store_true", help="remove without asking")
    db_clean.add_argument(
        "--include-stopped",
        action="store_true",
        help="also remove files of stopped daemons whose state dir still exists (their "
        "parked sessions are recomputed at the next start)",
    )
    db_clean.add_argument(
        "--shm-dir", type=Path, default=Path("/dev/shm"), help="where shm tier files live"
    )
    db_clean.set_defaults(run=db_cleanup)


def db_upgrade(args: argparse.Namespace) -> int:
    from agentpark.statedir import private_dir
    from agentpark.store.migrate import upgrade

    settings = settings_of(args)
    private_dir(settings.state_dir)
    upgrade(settings.database_url)
    print(f"database at head: {settings.database_url}")
    return 0


def db_cleanup(args: argparse.Namespace) -> int:
    from agentpark.cleanup import run_cleanup

    settings = load_settings(args.config)
    tiers = settings.tiers
    roots = [settings.state_dir]
    roots += [p.parent for p in (tiers.shm.path, tiers.disk.path) if p is not None]
    return run_cleanup(
        roots,
        shm_root=args.shm_dir,
        dry_run=args.dry_run,
        yes=args.yes,
        include_stopped=args.include_stopped,
    )
