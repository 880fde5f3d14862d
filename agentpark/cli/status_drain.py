"""``agentpark status | drain``: a running daemon, reached through ``agentpark.client``
(``--url``, ``--token``; default the config's server and ``$AGENTPARK_TOKEN``)."""

from __future__ import annotations

import argparse
import sys

from agentpark.cli.common import Commands, Subparsers, settings_of, token_of
from agentpark.cli.moves import add_to_arguments, run_drain_to

__all__ = ["add_status_drain_commands", "run_drain", "run_status"]


def add_status_drain_commands(commands: Commands, sub: Subparsers[argparse.ArgumentParser]) -> None:
    drain = commands.add(
        sub,
        "drain",
        commands.client,
        help="park every session of a running daemon into shm/disk, then stop it; with "
        "--to, hand its parked sessions to another daemon instead (it keeps running)",
    )
    add_to_arguments(drain, required=False)
    drain.add_argument("--tenant", default=None, help="with --to: only this tenant's sessions")
    drain.set_defaults(run=run_drain)
    status = commands.add(
        sub, "status", commands.client, help="print a running daemon's /v1/host as a table"
    )
    status.set_defaults(run=run_status)


def run_status(args: argparse.Namespace) -> int:
    from agentpark.status import print_status

    settings = settings_of(args)
    url = args.url or f"http://{settings.server.host}:{settings.server.port}"
    return print_status(url, token=token_of(args))


def run_drain(args: argparse.Namespace) -> int:
    if args.to:
        return run_drain_to(args)
    import httpx

    from agentpark.client import AgentparkAPIError, AgentparkClient

    settings = settings_of(args)
    url = args.url or f"http://{settings.server.host}:{settings.server.port}"
    timeout = settings.shutdown.deadline_s + 30
    try:
        with AgentparkClient(url, token=token_of(args), timeout=timeout) as client:
            summary = client.drain()
    except (httpx.HTTPError, AgentparkAPIError) as exc:
        print(f"agentpark: drain of {url} failed: {exc}", file=sys.stderr)
        return 1
    print(
        f"drained {url}: {summary.parked} parked, {summary.moved} moved to shm/disk, "
        f"{summary.already_safe} already safe, {summary.lost} will be recomputed"
    )
    return 0 if summary.lost == 0 else 1
