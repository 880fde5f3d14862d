"""The connector's modules load inside vLLM's processes: nothing heavy may come with them."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("jax", "fastapi", "sqlalchemy", "uvicorn", "agentpark.runtime", "agentpark.parking")


@pytest.mark.parametrize(
    "module",
    ["agentpark.connectors.protocol", "agentpark.connectors.client", "agentpark.connectors.steps"],
)
def test_connector_side_modules_import_nothing_heavy(module: str) -> None:
    probe = (
        f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", f"{module} pulls in {done.stdout[:300]}"


def test_the_probe_sees_a_heavy_import() -> None:
    probe = "import sys, agentpark.control.vllm; print('sqlalchemy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True"
