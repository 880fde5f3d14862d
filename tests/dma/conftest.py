"""tests/dma/tpu_real needs TPU Sync's real wheel (Python >= 3.12): `make test` runs it in
.venv-tpu after the main suite, or prints that it did NOT run. The main suite skips the
folder only where tpu_sync cannot be imported; where it can, the folder is collected."""

from __future__ import annotations

import importlib.util
import sys

collect_ignore = (
    ["tpu_real"]
    if sys.version_info < (3, 12) or importlib.util.find_spec("tpu_sync") is None
    else []
)
