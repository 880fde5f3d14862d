"""Dependencies point one way: the rooms below the session core load without JAX."""

from __future__ import annotations

import subprocess
import sys

import pytest

NO_JAX = [
    "agentpark.blocks",
    "agentpark.enums",
    "agentpark.snapshot",
    "agentpark.tiers.base",
    "agentpark.tiers.shm",
    "agentpark.tiers.disk",
    "agentpark.tiers.dram",
    "agentpark.integrity",
    "agentpark.store.repository",
    "agentpark.policy.rules",
    "agentpark.schemas.sessions",
    "agentpark.auth",
]


@pytest.mark.parametrize("module", NO_JAX)
def test_module_imports_without_jax(module: str) -> None:
    probe = (
        f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'jax'))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", f"{module} pulls in JAX: {done.stdout[:200]}"


def test_the_probe_sees_jax_where_it_is_imported() -> None:
    probe = "import sys, agentpark.engine.reference; print('jax' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True"
