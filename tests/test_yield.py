"""The daemon's own work yields a session to a user request: it waits, never gets 409.

Reproducers of issue 10 item 5: a policy park in flight made a user generate answer 409
``session_busy``; a ``wait=false`` pause showed ``parked`` a moment before it let go of
the session, so a resume sent on seeing it answered 409 too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import httpx
import pytest

from agentpark.config import Settings
from agentpark.dma.host_copy import HostCopyTransfer, NullObserver
from agentpark.store.models import EventRow
from tests.harness import Daemon, settled, wait_until

PROMPT = {"prompt": "Look this up for me, please.", "max_new_tokens": 20}


class Gate(NullObserver):
    """Holds every copy after its first chunk until opened."""

    def __init__(self, transfer: HostCopyTransfer) -> None:
        self.open = threading.Event()
        self.waiting = 0
        self._lock = threading.Lock()
        transfer.chunk_bytes = 1
        transfer.observer = self

    def on_chunk(self, nbytes: int) -> None:
        with self._lock:
            self.waiting += 1
        self.open.wait(timeout=60)


@pytest.fixture
def idle_daemon(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> Iterator[Daemon]:
    # The policy loop parks a session idle for 50 ms: it races every user request.
    yield daemon_factory(make_settings(policy={"idle_pause_after_s": 0.05, "tick_s": 0.02}))


def _in_thread(call: Callable[[], httpx.Response]) -> tuple[threading.Thread, list[httpx.Response]]:
    out: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    return thread, out


def test_a_generate_waits_for_a_policy_park_in_flight_instead_of_409(idle_daemon: Daemon) -> None:
    d = idle_daemon
    transfer = d.runtime.driver.transfer
    assert isinstance(transfer, HostCopyTransfer)
    c = d.client
    c.post("/v1/sessions", json={"session_id": "s"})
    gate = Gate(transfer)
    try:
        assert c.post("/v1/sessions/s/generate", json=PROMPT).status_code == 200
        live = d.runtime.parking.registry.find(("default", "s"))
        assert live is not None
        # The idle rule's park has the session and its copy is held.
        wait_until(lambda: gate.waiting >= 1 and live.lock.background)
        assert live.operation == "pause"
        thread, out = _in_thread(
            lambda: c.post("/v1/sessions/s/generate", json={"max_new_tokens": 3})
        )
        wait_until(lambda: live.lock.waiting == 1)  # the user request waits for it
        gate.open.set()
        thread.join(timeout=60)
    finally:
        gate.open.set()
        transfer.observer = NullObserver()
    (answer,) = out
    assert answer.status_code == 200, answer.text
    assert answer.json()["resumed"] is True  # the park finished, then the generate ran
    kinds = [e["kind"] for e in c.get("/v1/events", params={"session_id": "s"}).json()["events"]]
    assert kinds[:3] == ["generate", "resume", "pause"]


def test_a_resume_sent_on_seeing_parked_waits_for_the_wait_false_pause_to_let_go(
    daemon: Daemon,
) -> None:
    c = daemon.client
    c.post("/v1/sessions", json={"session_id": "s"})
    assert c.post("/v1/sessions/s/generate", json=PROMPT).status_code == 200
    committed = threading.Event()
    hold = threading.Event()

    def hold_after_commit(event: EventRow) -> None:
        # Runs in the background copy after the commit, before it lets go of the session.
        if event.kind == "pause" and event.session_id == "s":
            committed.set()
            hold.wait(timeout=60)

    daemon.runtime.parking.add_listener(hold_after_commit)
    try:
        accepted = c.post("/v1/sessions/s/pause", params={"wait": "false"})
        assert accepted.status_code == 202
        assert committed.wait(timeout=60)
        assert c.get("/v1/sessions/s").json()["state"] == "parked"  # what the client sees
        live = daemon.runtime.parking.registry.find(("default", "s"))
        assert live is not None and live.busy
        thread, out = _in_thread(lambda: c.post("/v1/sessions/s/resume"))
        wait_until(lambda: live.lock.waiting == 1)
        hold.set()
        thread.join(timeout=60)
    finally:
        hold.set()
    (answer,) = out
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "active"
    assert settled(daemon, "s", "active")


def test_two_user_operations_on_one_session_still_409(daemon: Daemon) -> None:
    c = daemon.client
    c.post("/v1/sessions", json={"session_id": "s"})
    live = daemon.runtime.parking.registry.find(("default", "s"))
    assert live is not None
    daemon.runtime.parking.registry.acquire(live, "generate")  # a user operation holds it
    try:
        busy = c.post("/v1/sessions/s/generate", json=PROMPT)
    finally:
        daemon.runtime.parking.registry.release(live)
    assert busy.status_code == 409
    assert busy.json()["error"]["code"] == "session_busy"
    assert c.post("/v1/sessions/s/generate", json=PROMPT).status_code == 200
