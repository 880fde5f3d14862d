"""tests/kvevents/dynamo_real need Dynamo's router core (ai-dynamo-runtime): collected only
by `make test-dynamo` (.venv-dynamo, which sets the variable); the main run never does."""

from __future__ import annotations

import os

DYNAMO_TESTS_ENV = "AGENTPARK_DYNAMO_TESTS"
collect_ignore = [] if os.environ.get(DYNAMO_TESTS_ENV) == "1" else ["dynamo_real"]
