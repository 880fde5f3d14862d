"""tests/connectors: a real daemon side of vLLM (VllmService) for the control-socket tests.

tests/connectors/tpu_real needs TPU Sync's real wheel (Python >= 3.12): `make test-tpu` runs
it in .venv-tpu; the main suite leaves the folder out only where tpu_sync cannot be imported.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentpark.config import Settings
from agentpark.connectors.client import ControlClient
from agentpark.connectors.protocol import encode_tokens
from agentpark.control.vllm import VllmService
from agentpark.parking import CoreOptions
from agentpark.policy.service import PolicyService
from agentpark.store.db import open_database
from agentpark.store.migrate import upgrade
from agentpark.store.repository import SessionStore
from tests.harness import tiny_settings

collect_ignore = (
    ["tpu_real"]
    if sys.version_info < (3, 12) or importlib.util.find_spec("tpu_sync") is None
    else []
)

TENANT = "default"


@dataclass
class ControlDaemon:
    """The daemon's vLLM side (SQLite file, control socket) and a connector's client of it."""

    settings: Settings
    store: SessionStore
    service: VllmService
    client: ControlClient

    def call(self, op: str, tokens: list[int] | None = None, **fields: Any) -> dict[str, Any]:
        blob = encode_tokens(tokens) if tokens is not None else b""
        answer = self.client.call(op, blob, wait_s=10.0, **fields)
        assert answer is not None, f"{op}: no answer"
        return answer

    def plan_park(self, session_id: str, tokens: list[int], blocks: list[int]) -> dict[str, Any]:
        """``prepare_store`` of a tool call (search, back in 60 s) the daemon parks."""
        plan = self.call(
            "prepare_store",
            tokens,
            tenant=TENANT,
            session_id=session_id,
            block_ids=blocks,
            tool="search",
            expected_resume_s=60.0,
        )
        assert plan["ok"] and plan["decision"] == "parked", plan
        return plan

    def kinds(self, session_id: str) -> list[str]:
        return [e.kind for e in reversed(self.store.events(TENANT, session_id, 100))]

    def restart(self) -> None:
        """Stop the service and start a new one on the same database and paths."""
        self._stop()
        self.service = control_service(self.settings, self.store)
        self.service.start()
        self.client.close()
        self.client = ControlClient(None, socket_path=str(self.service.socket_path), timeout_s=10)

    def _stop(self) -> None:
        self.service.stop()
        self.service.driver.core.close()
        if self.service.tier is not None:
            self.service.tier.close()

    def close(self) -> None:
        self.client.close()
        self._stop()
        self.store.close()


def control_service(settings: Settings, store: SessionStore) -> VllmService:
    # "shm" is checksummed: a worker-held pool must still claim no checksum.
    service = VllmService(settings, store, CoreOptions(checksum_tiers=frozenset({"shm"})))
    PolicyService(service.driver.core, store, settings.policy)  # the advisor, as the daemon's
    return service


@pytest.fixture
def control_daemon(tmp_path: Path, shm_dir: Path) -> Iterator[ControlDaemon]:
    settings = tiny_settings(
        tmp_path / "state",
        shm_dir,
        vllm={"enabled": True, "pool_capacity": 1 << 20, "pool_path": shm_dir / "pool"},
    )
    upgrade(settings.database_url)
    store = SessionStore(*open_database(settings.database_url))
    service = control_service(settings, store)
    service.start()
    made = ControlDaemon(
        settings,
        store,
        service,
        ControlClient(None, socket_path=str(service.socket_path), timeout_s=10),
    )
    yield made
    made.close()
