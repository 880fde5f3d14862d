"""Dynamo's KV router core, as installed from PyPI (ai-dynamo-runtime, .venv-dynamo)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentpark.config import Settings
from tests.harness import DaemonProcess

if importlib.util.find_spec("dynamo") is None:  # collected only by `make test-dynamo`
    raise pytest.UsageError(
        f"tests/kvevents/dynamo_real need ai-dynamo-runtime, which {sys.executable} lacks: "
        "run `make test-dynamo` (it makes .venv-dynamo)"
    )

from tests.kvevents.dynamo_real.hosts import Host, Router, make_router


@pytest.fixture
def router(
    make_settings: Callable[..., Settings],
    daemon_process: Callable[[Path, int], DaemonProcess],
    tmp_path: Path,
) -> Iterator[tuple[Router, Callable[..., Host]]]:
    """Daemons as Dynamo workers (``host(worker_id, **policy)``) and one RadixTree."""
    yield from make_router(make_settings, daemon_process, tmp_path)
