"""pause_now / resume_now: small pauses and resumes on the caller's thread, only when
nothing in them can wait; otherwise None, with nothing changed, so the route hands them to
a worker thread."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from agentpark.config import Settings
from agentpark.parking import PauseOrder, pausing, restoring
from agentpark.runtime import Runtime

FORCED = PauseOrder(force=True)


@pytest.fixture
def runtime(make_settings: Callable[..., Settings]) -> Iterator[Runtime]:
    runtime = Runtime.start(
        make_settings(
            pool={"num_blocks": 24},
            tiers={
                "dram": {"capacity": 12 * 4096},
                "shm": {"capacity": 0},
                "disk": {"capacity": 12 * 4096},
            },
            limits={"admission_timeout_s": 0},
        )
    )
    yield runtime
    runtime.shutdown()


def _active(runtime: Runtime, sid: str = "s") -> np.ndarray:
    runtime.parking.create("t", sid, None)
    runtime.driver.generate("t", sid, [5, 6, 7], 10)
    return _kv(runtime, sid)


def _kv(runtime: Runtime, sid: str) -> np.ndarray:
    blocks = list(runtime.engine.allocator.owned(("t", sid)))
    return np.asarray(runtime.engine.kv_pool()[0])[blocks].copy()


class HeldElsewhere:
    """Another thread holds a lock until told to let go (a decode step holding the engine)."""

    def __init__(self, lock: threading.RLock) -> None:
        self.taken, self.done = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, args=(lock,), daemon=True)

    def _hold(self, lock: threading.RLock) -> None:
        with lock:
            self.taken.set()
            self.done.wait(10)

    def __enter__(self) -> HeldElsewhere:
        self.thread.start()
        assert self.taken.wait(10)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.done.set()
        self.thread.join(10)


def test_a_small_pause_and_resume_run_inline_and_bit_exact(runtime: Runtime) -> None:
    kv = _active(runtime)
    paused = runtime.parking.pause_now("t", "s", FORCED)
    assert paused is not None and paused.pause_ms is not None
    assert paused.row.state == "parked" and paused.row.tier == "dram"
    resumed = runtime.parking.resume_now("t", "s")
    assert resumed is not None and resumed.restored_from == "dram"
    assert resumed.row.state == "active"
    np.testing.assert_array_equal(_kv(runtime, "s"), kv)
    kinds = [e.kind for e in runtime.parking.list_events("t", "s", 2)]
    assert kinds[:2] == ["resume", "pause"]  # newest first: the same events as pause/resume
    runtime.driver.check_invariants()


def test_nothing_runs_inline_while_the_engine_is_held_elsewhere(runtime: Runtime) -> None:
    _active(runtime)
    with HeldElsewhere(runtime.engine.lock):
        assert runtime.parking.pause_now("t", "s", FORCED) is None
        assert runtime.parking.get("t", "s").state == "active"
        assert runtime.parking.tiers["dram"].used_blocks == 0
    runtime.parking.pause("t", "s", FORCED)
    with HeldElsewhere(runtime.engine.lock):
        assert runtime.parking.resume_now("t", "s") is None
        assert runtime.parking.get("t", "s").state == "parked"
    runtime.driver.check_invariants()


def test_nothing_runs_inline_while_the_session_is_held(runtime: Runtime) -> None:
    _active(runtime)
    live = runtime.parking.live("t", "s")
    runtime.parking.registry.acquire(live, "policy", background=True)
    try:
        assert runtime.parking.pause_now("t", "s", FORCED) is None
        assert live.operation == "policy"  # still the holder's
    finally:
        runtime.parking.registry.release(live)
    assert runtime.parking.pause_now("t", "s", FORCED) is not None


def test_a_pause_into_disk_or_a_large_session_goes_to_a_worker(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    _active(runtime)
    # Disk: the landing fsyncs. The reservation is given back, the session untouched.
    assert runtime.parking.pause_now("t", "s", PauseOrder(tier="disk", force=True)) is None
    assert runtime.parking.get("t", "s").state == "active"
    assert runtime.parking.tiers["disk"].used_blocks == 0
    runtime.driver.check_invariants()
    monkeypatch.setattr(pausing, "INLINE_BYTES", 4095)  # under one 4 KiB block
    assert runtime.parking.pause_now("t", "s", FORCED) is None
    monkeypatch.undo()
    runtime.parking.pause("t", "s", PauseOrder(tier="disk", force=True))
    assert runtime.parking.resume_now("t", "s") is None  # parked on disk: a worker's
    assert runtime.parking.get("t", "s").state == "parked"
    runtime.parking.resume("t", "s")
    runtime.parking.pause("t", "s", FORCED)
    monkeypatch.setattr(restoring, "INLINE_BYTES", 4095)
    assert runtime.parking.resume_now("t", "s") is None
    runtime.driver.check_invariants()


def test_a_resume_that_would_wait_for_blocks_goes_to_a_worker(runtime: Runtime) -> None:
    _active(runtime)
    runtime.parking.pause("t", "s", FORCED)
    engine = runtime.engine
    filler = engine.allocator.allocate(("t", "filler"), engine.allocator.num_free)
    try:
        assert runtime.parking.resume_now("t", "s") is None
        assert runtime.parking.get("t", "s").state == "parked"
    finally:
        engine.allocator.free(("t", "filler"), filler)
    assert runtime.parking.resume_now("t", "s") is not None


def test_a_lost_session_recomputes_on_a_worker(runtime: Runtime) -> None:
    _active(runtime)
    runtime.parking.pause("t", "s", FORCED)
    live = runtime.parking.live("t", "s")
    with runtime.parking.registry.operation(live, "test"):  # lose_copy: the caller holds it
        runtime.parking.lose_copy(live, "dram", "test: the copy is gone")
    assert runtime.parking.get("t", "s").state == "lost"
    assert runtime.parking.resume_now("t", "s") is None
    assert runtime.parking.resume("t", "s").restored_from == "recompute"
