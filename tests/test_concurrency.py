"""Pause and resume never block the event loop or other sessions; wait=false answers 202;
many agents on a pool too small for them, with the policy loop interfering, never fail."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator

import httpx
import pytest

from agentpark.config import Settings
from agentpark.dma.host_copy import HostCopyTransfer, NullObserver
from tests.harness import Daemon, settled, wait_until

FIRST = {"prompt": "Look this up for me, please.", "max_new_tokens": 30}
NEXT = {"max_new_tokens": 10, "return_logits": True}


class Gate(NullObserver):
    """Holds every copy after its first chunk until opened (outside the engine lock)."""

    def __init__(self, transfer: HostCopyTransfer) -> None:
        self.open = threading.Event()
        self.waiting = 0
        self._lock = threading.Lock()
        transfer.chunk_bytes = 1  # one block per chunk: a multi-chunk copy
        transfer.observer = self

    def on_chunk(self, nbytes: int) -> None:
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
    transfer.observer = NullObserver()


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


def test_a_pause_that_finds_the_engine_busy_waits_on_a_worker_not_on_the_event_loop(
    daemon: Daemon,
) -> None:
    """A small pause runs on the event loop only when nothing makes it wait (agentpark.
    parking.pausing.Pausing.pause_now): with the engine held by a step in another thread,
    it goes to a worker, and the loop keeps answering while that worker waits."""
    c = daemon.client
    c.post("/v1/sessions", json={"session_id": "s"})
    c.post("/v1/sessions/s/generate", json=FIRST)
    held, done = threading.Event(), threading.Event()

    def decode_step() -> None:  # holds the engine as a decode step does
        with daemon.runtime.engine.lock:
            held.set()
            done.wait(30)

    holder = threading.Thread(target=decode_step, daemon=True)
    holder.start()
    assert held.wait(10)
    answers: list[httpx.Response] = []
    pause = threading.Thread(
        target=lambda: answers.append(c.post("/v1/sessions/s/pause", json={"force": True}))
    )
    try:
        pause.start()
        wait_until(lambda: _state(daemon, "s") == "pausing")  # reserved; its copy waits
        assert c.get("/healthz").status_code == 200  # the event loop is not the one waiting
        assert _state(daemon, "s") == "pausing" and not answers
    finally:
        done.set()
        holder.join(10)
        pause.join(30)
    (answer,) = answers
    assert answer.status_code == 200 and answer.json()["state"] == "parked"
    resumed = c.post("/v1/sessions/s/resume")
    assert resumed.status_code == 200 and resumed.json()["restored_from"] == "dram"


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


# ---- many agents against a pool too small for them, with the policy loop interfering ----


def _agents(
    daemon: Daemon, n: int, steps: Callable[[httpx.Client, str], list[httpx.Response]]
) -> Counter[int]:
    """Run ``n`` agents at once, each on its own connection; every answer's status."""
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(n)

    def agent(i: int) -> None:
        with httpx.Client(base_url=daemon.url, timeout=300) as client:
            start.wait(timeout=120)
            try:
                answers = steps(client, f"agent{i}")
            except httpx.HTTPError as exc:  # a dropped connection is a failed request
                with lock:
                    failures.append(f"agent{i}: {type(exc).__name__}: {exc}")
                return
        with lock:
            for answer in answers:
                statuses[answer.status_code] += 1
                if answer.status_code >= 300:
                    failures.append(f"agent{i}: {answer.status_code} {answer.text[:300]}")

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "an agent did not finish"
    assert failures == [], failures[:10]
    return statuses


# The policy loop at full interference: every session idle 20 ms is parked, parked ones
# are demoted after 20 ms and prefetched back as soon as their expected resume is near.
BUSY_POLICY = {
    "tick_s": 0.01,
    "idle_pause_after_s": 0.02,
    "demote_after_s": {"dram": 0.02},
    "prefetch_lead_s": 60.0,
    "hbm_high_watermark": 0.75,
}


def test_64_agents_on_a_pool_for_a_quarter_of_them_no_failure_no_409_no_5xx(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    # Each agent ends with 4 blocks (56 tokens); the 64 blocks hold 16 of the 64 agents.
    settings = make_settings(
        pool={"num_blocks": 64},
        tiers={"dram": {"capacity": 256 * 4096}, "shm": {"capacity": 256 * 4096}},
        policy=BUSY_POLICY,
        limits={"admission_timeout_s": 300},
    )
    daemon = daemon_factory(settings)

    def steps(c: httpx.Client, sid: str) -> list[httpx.Response]:
        first = {
            "prompt_tokens": [(int(sid[5:]) + i) % 200 for i in range(40)],
            "max_new_tokens": 8,
        }
        pause = {"tool": "search", "expected_resume_s": 0.05, "force": True}
        return [
            c.post("/v1/sessions", json={"session_id": sid}),
            c.post(f"/v1/sessions/{sid}/generate", json=first),
            c.post(f"/v1/sessions/{sid}/pause", json=pause),
            c.post(f"/v1/sessions/{sid}/resume"),
            c.post(f"/v1/sessions/{sid}/generate", json={"max_new_tokens": 8}),
            c.delete(f"/v1/sessions/{sid}"),
        ]

    statuses = _agents(daemon, 64, steps)
    assert statuses[200] + statuses[201] + statuses[204] == 64 * 6, statuses
    events = daemon.client.get("/v1/events", params={"limit": 10_000}).json()["events"]
    reasons = Counter(e["reason"] for e in events if e["kind"] == "pause")
    assert reasons["pressure"] > 0, reasons  # the pool really was too small for them
    host = daemon.client.get("/v1/host").json()
    assert host["pool"]["used_blocks"] == 0
    daemon.runtime.driver.check_invariants()


def test_24_agents_starting_at_once_on_the_default_pool_get_no_507(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    # The default pool (256 blocks) and policy; each first generate needs 15 blocks, so
    # 24 of them at once (360 blocks) do not fit: before admission, 8 got 507 pool_full.
    defaults = Settings.model_fields["pool"].default
    settings = make_settings(
        pool={"num_blocks": defaults.num_blocks},
        tiers={"dram": {"capacity": 512 * 4096}},
        policy={"idle_pause_after_s": 30.0, "tick_s": 1.0},
    )
    daemon = daemon_factory(settings)

    def steps(c: httpx.Client, sid: str) -> list[httpx.Response]:
        body = {"prompt_tokens": [3] * 224, "max_new_tokens": 16}
        return [
            c.post("/v1/sessions", json={"session_id": sid}),
            c.post(f"/v1/sessions/{sid}/generate", json=body),
        ]

    statuses = _agents(daemon, 24, steps)
    assert statuses == Counter({201: 24, 200: 24})
    daemon.runtime.driver.check_invariants()


def test_32_agents_with_the_policy_loop_on_get_no_409(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    settings = make_settings(
        tiers={"dram": {"capacity": 256 * 4096}, "shm": {"capacity": 256 * 4096}},
        policy=BUSY_POLICY,
    )
    daemon = daemon_factory(settings)

    def steps(c: httpx.Client, sid: str) -> list[httpx.Response]:
        pause = {"tool": "search", "expected_resume_s": 0.05, "force": True}
        return [
            c.post("/v1/sessions", json={"session_id": sid}),
            c.post(
                f"/v1/sessions/{sid}/generate", json={"prompt": "hi " * 20, "max_new_tokens": 6}
            ),
            c.post(f"/v1/sessions/{sid}/pause", json=pause),
            c.post(f"/v1/sessions/{sid}/generate", json={"max_new_tokens": 6}),
            c.delete(f"/v1/sessions/{sid}"),
        ]

    statuses = _agents(daemon, 32, steps)
    assert statuses[409] == 0 and sum(statuses.values()) == 32 * 5, statuses
