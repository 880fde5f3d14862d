"""Admission instead of 507: room is made by parking idle sessions, else requests queue.

Reproducers of issue 10 item 6: ``POST /resume`` answered 507 while idle sessions could be
parked to make room (generate parked them, resume did not); a request that found the pool
full failed at once where waiting would have succeeded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx

from agentpark.config import Settings
from agentpark.parking import LiveSession
from tests.harness import InProcessApp, wait_until

# No policy loop: only the requests themselves park sessions here.
SMALL = {"pool": {"num_blocks": 16}, "model": {"max_seq_len": 256}, "policy": {"enabled": False}}


def _http(app: InProcessApp) -> httpx.Client:
    headers = {"Authorization": f"Bearer {app.token()}"}
    return httpx.Client(
        transport=app.transport, base_url="http://in-process", timeout=120, headers=headers
    )


def _create_and_fill(c: httpx.Client, sid: str, tokens: int, new: int = 4) -> None:
    assert c.post("/v1/sessions", json={"session_id": sid}).status_code == 201
    body = {"prompt_tokens": [7] * tokens, "max_new_tokens": new}
    answer = c.post(f"/v1/sessions/{sid}/generate", json=body)
    assert answer.status_code == 200, answer.text


@contextmanager
def held(app: InProcessApp, sid: str) -> Iterator[LiveSession]:
    """A user operation holds ``sid`` (so nothing may park it) until the block ends."""
    core = app.runtime.parking
    live = core.registry.find(("default", sid))
    assert live is not None
    core.registry.acquire(live, "generate")
    try:
        yield live
    finally:
        core.registry.release(live)


def _in_thread(call: Callable[[], httpx.Response]) -> tuple[threading.Thread, list[httpx.Response]]:
    out: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    return thread, out


def test_resume_parks_an_idle_session_when_the_pool_is_full_instead_of_507(
    make_settings: Callable[..., Settings], app_factory: Callable[[Settings], InProcessApp]
) -> None:
    app = app_factory(make_settings(**SMALL, limits={"admission_timeout_s": 0}))
    c = _http(app)
    _create_and_fill(c, "x", 60)  # 64 tokens: 4 blocks
    assert c.post("/v1/sessions/x/pause", json={"force": True}).json()["state"] == "parked"
    for i in range(4):  # four idle sessions fill the pool's 16 blocks
        _create_and_fill(c, f"idle{i}", 60)
    assert app.runtime.host_snapshot().pool.free_blocks == 0
    answer = c.post("/v1/sessions/x/resume")
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "active"
    # The least recently used idle session made the room, by pressure.
    assert c.get("/v1/sessions/idle0").json()["state"] == "parked"
    events = c.get("/v1/events", params={"session_id": "idle0"}).json()["events"]
    assert events[0]["kind"] == "pause" and events[0]["reason"] == "pressure"
    app.runtime.driver.check_invariants()


def test_a_later_smaller_request_never_overtakes_an_earlier_waiter(
    make_settings: Callable[..., Settings], app_factory: Callable[[Settings], InProcessApp]
) -> None:
    app = app_factory(make_settings(**SMALL))
    c = _http(app)
    _create_and_fill(c, "hog", 200, 8)  # 208 tokens: 13 of the 16 blocks
    for sid in ("first", "second"):
        assert c.post("/v1/sessions", json={"session_id": sid}).status_code == 201
    admission = app.runtime.driver.admission
    with held(app, "hog"):  # busy: it cannot be parked to make room
        big = {"prompt_tokens": [5] * 60, "max_new_tokens": 4}  # 4 blocks: 3 are free
        t1, out1 = _in_thread(lambda: c.post("/v1/sessions/first/generate", json=big))
        wait_until(lambda: admission.waiting == 1)
        small = {"prompt_tokens": [5] * 8, "max_new_tokens": 2}  # 1 block would fit now
        t2, out2 = _in_thread(lambda: c.post("/v1/sessions/second/generate", json=small))
        wait_until(lambda: admission.waiting == 2)  # queued behind the first
        assert app.runtime.host_snapshot().pool.free_blocks == 3  # it took nothing
    # The hog's blocks go back: the delete wakes the queue, both are served in turn.
    assert c.delete("/v1/sessions/hog").status_code == 204
    t1.join(timeout=120)
    t2.join(timeout=120)
    assert out1[0].status_code == 200, out1[0].text
    assert out2[0].status_code == 200, out2[0].text
    first = c.get("/v1/events", params={"session_id": "first"}).json()["events"][0]
    second = c.get("/v1/events", params={"session_id": "second"}).json()["events"][0]
    assert first["kind"] == second["kind"] == "generate"
    assert admission.waiting == 0
    app.runtime.driver.check_invariants()


def test_a_waiter_that_holds_blocks_parks_itself_so_the_head_can_go(
    make_settings: Callable[..., Settings], app_factory: Callable[[Settings], InProcessApp]
) -> None:
    app = app_factory(make_settings(**SMALL))
    c = _http(app)
    _create_and_fill(c, "hog", 140, 4)  # 144 tokens: 9 blocks
    _create_and_fill(c, "grower", 60, 4)  # 64 tokens: 4 blocks; 3 free
    admission = app.runtime.driver.admission
    with held(app, "hog"):
        grow = {"prompt_tokens": [5] * 60, "max_new_tokens": 4}  # needs 4 more: must wait
        thread, out = _in_thread(lambda: c.post("/v1/sessions/grower/generate", json=grow))
        wait_until(lambda: admission.waiting == 1)
        # While it waits it holds no blocks: it parked itself for the requests behind it.
        # Wait for the blocks, not the state: a park shows PARKED a moment before its
        # commit is in and its blocks go back (the hog is held, so only the grower frees).
        wait_until(lambda: app.runtime.host_snapshot().pool.free_blocks == 7)
        assert c.get("/v1/sessions/grower").json()["state"] == "parked"
        assert admission.waiting == 1
    assert c.post("/v1/sessions/hog/pause", json={"force": True}).status_code == 200
    thread.join(timeout=120)
    assert out[0].status_code == 200, out[0].text
    assert out[0].json()["resumed"] is True and out[0].json()["num_tokens"] == 128
    app.runtime.driver.check_invariants()


def test_507_only_after_the_time_out_and_with_retry_after(
    make_settings: Callable[..., Settings], app_factory: Callable[[Settings], InProcessApp]
) -> None:
    app = app_factory(make_settings(**SMALL, limits={"admission_timeout_s": 0.2}))
    c = _http(app)
    _create_and_fill(c, "hog", 200, 8)
    assert c.post("/v1/sessions", json={"session_id": "late"}).status_code == 201
    with held(app, "hog"):
        big = {"prompt_tokens": [5] * 60, "max_new_tokens": 4}
        answer = c.post("/v1/sessions/late/generate", json=big)
    assert answer.status_code == 507
    error = answer.json()["error"]
    assert error["code"] == "pool_full" and error["details"]["waited_s"] == 0.2
    assert answer.headers["Retry-After"] == "1"
    assert app.runtime.driver.admission.waiting == 0
    # Nothing changed: the session is still empty and the pool holds only the hog.
    assert c.get("/v1/sessions/late").json()["num_tokens"] == 0
    assert app.runtime.host_snapshot().pool.free_blocks == 3
