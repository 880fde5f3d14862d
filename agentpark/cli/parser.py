"""The ``agentpark`` argument parser: the top-level ``--config`` and every command group,
each added by its own module."""

from __future__ import annotations

import argparse
from pathlib import Path

from agentpark.cli.bench import add_bench_commands
from agentpark.cli.common import CONFIG_HELP, Commands
from agentpark.cli.db import add_db_commands
from agentpark.cli.moves import add_move_commands
from agentpark.cli.serve import add_serve_command
from agentpark.cli.status_drain import add_status_drain_commands
from agentpark.cli.tokens import add_token_commands
from agentpark.cli.vllm import add_vllm_commands

__all__ = ["DESCRIPTION", "build_parser"]

DESCRIPTION = """\
Command line: ``agentpark serve | db upgrade | db cleanup | token ... | status | drain |
session move | bench ... | make-model | vllm serve | vllm demo``.

``--config FILE`` may come before the subcommand or after it (``agentpark serve --config
FILE``); ``status`` and ``drain`` talk to the daemon through ``agentpark.client`` (with
``--token``, default ``$AGENTPARK_TOKEN``); ``db`` and ``token`` work on the state dir's
database directly, whether a daemon runs on it or not. Everything after a ``--`` goes to
vLLM unchanged (``agentpark vllm serve MODEL -- ARGS``).
"""


def build_parser() -> argparse.ArgumentParser:
    """Every command; each sets ``run`` (the function that runs it) on the namespace."""
    parser = argparse.ArgumentParser(prog="agentpark", description=DESCRIPTION)
    parser.add_argument("--config", type=Path, default=None, help=CONFIG_HELP)
    commands = Commands()
    sub = parser.add_subparsers(title="commands")
    add_serve_command(commands, sub)
    add_db_commands(commands, sub)
    add_token_commands(commands, sub)
    add_status_drain_commands(commands, sub)
    add_move_commands(commands, sub)
    add_bench_commands(commands, sub)
    add_vllm_commands(commands, sub)
    return parser
