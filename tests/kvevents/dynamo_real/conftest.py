"""Dynamo's KV router core, as installed from PyPI (ai-dynamo-runtime, .venv-dynamo)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

if importlib.util.find_spec("dynamo") is None:  # collected only by `make test-dynamo`
    raise pytest.UsageError(
        f"tests/kvevents/dynamo_real need ai-dynamo-runtime, which {sys.executable} lacks: "
        "run `make test-dynamo` (it makes .venv-dynamo)"
    )
