"""Where the ``agentpark`` command starts: parse (keeping what follows ``--`` for vLLM),
run the chosen command, turn a configuration error into a message and exit 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from agentpark.cli.parser import build_parser
from agentpark.errors import ConfigError

__all__ = ["main", "parse_args"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, sys.argv[1:] if argv is None else argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        return int(args.run(args))
    except ConfigError as exc:
        print(f"agentpark: {exc.message}", file=sys.stderr)
        return 2


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv``; what follows the first ``--`` is kept, unparsed, in ``extra_args``.

    Split here, not by argparse: Python 3.11's drops or refuses a second ``--``, and vLLM's
    own arguments must arrive exactly as given. Only ``vllm serve`` takes them.
    """
    words = list(argv)
    passthrough: list[str] = []
    if "--" in words:
        at = words.index("--")
        words, passthrough = words[:at], words[at + 1 :]
    args = parser.parse_args(words)
    if passthrough and not getattr(args, "passthrough", False):
        parser.error("arguments after -- are only for `agentpark vllm serve`")
    args.extra_args = passthrough
    return args
