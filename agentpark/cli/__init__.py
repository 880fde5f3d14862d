"""The ``agentpark`` command (``agentpark.cli:main``; ``python -m agentpark`` too).

One module per job, arrows pointing down: ``entry`` (main, parse_args) -> ``parser`` (the
whole parser) -> one module per command group (``serve``, ``db``, ``tokens``,
``status_drain``, ``bench``, ``vllm``) -> ``common`` (the shared parent parsers, settings,
token). What each command does is in :data:`agentpark.cli.parser.DESCRIPTION`.
"""

from agentpark.cli.entry import main, parse_args
from agentpark.cli.parser import build_parser
from agentpark.cli.serve import uvicorn_config

__all__ = ["build_parser", "main", "parse_args", "uvicorn_config"]
