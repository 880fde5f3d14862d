"""What every command module of the CLI shares: the ``--config`` and client parent parsers,
adding a subcommand with them, and reading the settings, token and config path of a run."""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentpark.config import Settings, load_settings

__all__ = [
    "CONFIG_HELP",
    "Commands",
    "Subparsers",
    "env_config",
    "print_help",
    "settings_of",
    "token_of",
]

CONFIG_HELP = "TOML config file (default: $AGENTPARK_CONFIG, else none)"

Subparsers = argparse._SubParsersAction  # what add_subparsers returns


def _common_parent() -> argparse.ArgumentParser:
    # Every subcommand takes --config too (after its name). SUPPRESS: one not given there
    # leaves the namespace alone, so a --config before the subcommand still counts; given
    # in both places, the later one wins.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, default=argparse.SUPPRESS, help=CONFIG_HELP)
    return common


def _client_parent() -> argparse.ArgumentParser:
    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--url", help="daemon URL (default: from the config's server section)")
    client.add_argument(
        "--token",
        default=None,
        help="sent as 'Authorization: Bearer TOKEN' (default: $AGENTPARK_TOKEN)",
    )
    return client


@dataclass
class Commands:
    """Adds subcommands that all take ``--config``; ``client`` is the parent of the
    commands that talk to a running daemon (``--url``, ``--token``)."""

    common: argparse.ArgumentParser = field(default_factory=_common_parent)
    client: argparse.ArgumentParser = field(default_factory=_client_parent)

    def add(
        self,
        subparsers: Subparsers[argparse.ArgumentParser],
        name: str,
        *parents: argparse.ArgumentParser,
        **kwargs: Any,
    ) -> argparse.ArgumentParser:
        return subparsers.add_parser(name, parents=[self.common, *parents], **kwargs)

    def group(
        self, subparsers: Subparsers[argparse.ArgumentParser], name: str, title: str, help: str
    ) -> Subparsers[argparse.ArgumentParser]:
        """A command of commands (``db``, ``token``, ...): alone it prints its help, exit 2."""
        parser = self.add(subparsers, name, help=help)
        parser.set_defaults(run=lambda _args: print_help(parser))
        return parser.add_subparsers(title=title)


def print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def settings_of(args: argparse.Namespace) -> Settings:
    """The run's settings (``--config``), with logging set to their level."""
    settings = load_settings(args.config)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    return settings


def token_of(args: argparse.Namespace) -> str | None:
    """--token, else $AGENTPARK_TOKEN, else none (the loopback default)."""
    from agentpark.auth import TOKEN_ENV

    return args.token or os.environ.get(TOKEN_ENV) or None


def env_config() -> Path | None:
    """$AGENTPARK_CONFIG as a path, or None when unset."""
    from agentpark.config import CONFIG_ENV

    value = os.environ.get(CONFIG_ENV)
    return Path(value) if value else None
