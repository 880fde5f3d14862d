"""Pause and resume never block the event loop or other sessions; wait=false answers 202."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from agentpark.dma.host_copy import HostCopyTransfer
from tests.conftest import Daemon, settled, wait_until

FIRST = {"prompt": "Look this up for me, please.", "max_new_tokens": 30}
NEXT = {"max_new_tokens": 10, "return_logits": True}


class Gate:
    """Holds every copy after its first chunk until opened (outside the engine lock)."""

    def __init__(self, transfer: HostCopyTransfer) -> None:
        self.open = threading.Event()
        self.waiting = 0
        self._lock = threading.Lock()
        transfer.chunk_bytes = 1  # one block per chunk: a multi-chunk copy
        transfer.chunk_hook = self._hold

    def _hold(self, _nbytes: int) -> None:
        with self._lock:
            self.waiting += 1
        self.open.wait(timeout=60)


@pytest.fixture
def gate(daemon: Daemon) -> Iterator[Gate]:
    transfer = daemon.runtime.driver.transfer
    assert isinstance(transfer, HostCopyTransfer)
    gate = Gate(transfer)
    yield gate
    gate.open.set()
    transfer.chunk_hook = None


def _state(daemon: Daemon, sid: str) -> str:
    state: str = daemon.client.get(f"/v1/sessions/{sid}").json()["state"]
    return state


def test_health_and_other_sessions_answer_while_a_pause_is_in_flight(
    daemon: Daemon, gate: Gate
) -> None:
    c = daemon.client
    for sid in ("big", "other"):
        c.post("/v1/sessions", json={"session_id": sid})
        c.post(f"/v1/sessions/{sid}/generate", json=FIRST)
    accepted = c.post("/v1/sessions/big/pause", params={"wait": "false"})
    assert accepted.status_code == 202 and accepted.json()["state"] == "pausing"
    assert accepted.json()["pause_ms"] is None
    wait_until(lambda: gate.waiting >= 1)  # the copy is under way and held

    assert c.get("/healthz").status_code == 200
    out = c.post("/v1/sessions/other/generate", json={"max_new_tokens": 5})
    assert out.status_code == 200 and len(out.json()["tokens"]) == 5
    busy = c.post("/v1/sessions/big/resume")
    assert busy.status_code == 409 and busy.json()["error"]["details"]["in_flight"] == "pause"
    assert _state(daemon, "big") == "pausing"  # all of the above answered first

    gate.open.set()
    wait_until(lambda: settled(daemon, "big", "parked"))
    events = c.get("/v1/events", params={"session_id": "big"}).json()["events"]
    assert events[0]["kind"] == "pause" and events[0]["bytes"] > 0


def test_two_sessions_pausing_at_once_both_finish_and_resume_bit_exact(
    daemon: Daemon, gate: Gate
) -> None:
    c = daemon.client
    for sid in ("a", "b", "twin"):
        c.post("/v1/sessions", json={"session_id": sid})
        c.post(f"/v1/sessions/{sid}/generate", json=FIRST)
    for sid in ("a", "b"):
        assert c.post(f"/v1/sessions/{sid}/pause", params={"wait": "false"}).status_code == 202
    wait_until(lambda: gate.waiting >= 2)  # both copies in flight at the same time
    gate.open.set()
    wait_until(lambda: settled(daemon, "a", "parked") and settled(daemon, "b", "parked"))
    daemon.runtime.driver.check_invariants()

    reference = c.post("/v1/sessions/twin/generate", json=NEXT).json()
    for sid in ("a", "b"):
        r = c.post(f"/v1/sessions/{sid}/resume", params={"wait": "false"})
        assert r.status_code == 202 and r.json()["state"] == "resuming"
    wait_until(lambda: settled(daemon, "a", "active") and settled(daemon, "b", "active"))
    for sid in ("a", "b"):
        out = c.post(f"/v1/sessions/{sid}/generate", json=NEXT).json()
        assert out["resumed"] is False
        assert out["tokens"] == reference["tokens"] and out["logits"] == reference["logits"]
