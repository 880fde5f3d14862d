"""The pin book, the prefill meter and the engine view (agentpark.connectors.pins), fast.

vLLM is not in this venv: its block pool is a stand-in with the attributes the connector
reads (``num_gpu_blocks``, ``get_num_free_blocks``, ``blocks[i].ref_cnt``). The control
connection's generation is tested against the real daemon side (its restart).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from agentpark.connectors.client import ControlClient
from agentpark.connectors.pins import EngineView, Pin, PinBook, Pins, PrefillMeter, share_room
from agentpark.connectors.steps import StepPlan
from agentpark.connectors.worker import WorkerSide
from tests.connectors.conftest import ControlDaemon


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class BlockPool:
    """STAND-IN for vLLM's BlockPool: what EngineView reads."""

    num_gpu_blocks: int
    free: int
    blocks: list[SimpleNamespace] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.blocks = [SimpleNamespace(ref_cnt=1) for _ in range(self.num_gpu_blocks)]

    def get_num_free_blocks(self) -> int:
        return self.free


def _pin(req: str, session: str, blocks: list[int], back_in: float, ttl: float = 30.0) -> Pin:
    return Pin(req, session, blocks, [1] * 4 * len(blocks), {}, 100.0 + back_in, 100.0 + ttl, 0)


def test_the_book_orders_pressure_by_latest_expected_return_and_finds_returns() -> None:
    book = PinBook()
    book.add(_pin("r1", "soon", [1, 2], back_in=0.5))
    book.add(_pin("r2", "late", [3], back_in=60.0))
    book.add(_pin("r3", "mid", [4, 5, 6], back_in=5.0, ttl=1.0))
    assert [p.session_id for p in book.pressure_order()] == ["late", "mid", "soon"]
    assert book.blocks == 6
    assert book.of_session("mid") is book.pins["r3"]
    assert book.holding([9, 2]) is book.pins["r1"]  # holds its last block: the whole prefix
    assert book.holding([1]) is None  # only its first block: another prompt sharing a prefix
    assert [p.req_id for p in book.expired(101.0)] == ["r3"]
    assert book.take("r3") is not None and book.take("r3") is None
    assert share_room(0.5, 47) == 23 and share_room(0.0, 47) == 0


def test_the_prefill_meter_is_the_median_of_prefill_heavy_steps() -> None:
    clock = Clock()
    meter = PrefillMeter(min_tokens=32, clock=clock)
    assert meter.ms_per_token is None
    for tokens, took_s in [(256, 0.128), (2, 0.004), (512, 0.256), (128, 9.0), (300, 0.15)]:
        meter.step(tokens)
        clock.now += took_s
    meter.step(0)
    # 0.5 ms/token three times, one step then idle (70 ms/token), the decode step left out
    assert meter.ms_per_token is not None and abs(meter.ms_per_token - 0.5) < 1e-9


def test_the_engine_view_reads_the_pool_and_finds_a_blocked_waiting_request() -> None:
    view = EngineView(block_size=16)
    assert view.total_blocks is None and view.freeable([1, 2]) == 2
    pool = BlockPool(num_gpu_blocks=49, free=3)
    view.pool = pool
    assert view.total_blocks == 48 and view.free_blocks == 3
    pool.blocks[2].ref_cnt = 2  # another request holds it too: a release does not free it
    assert view.freeable([1, 2, 3]) == 2
    view.asked("admitted", num_tokens=100, num_computed=0)
    view.allocated("admitted")
    view.asked("blocked", num_tokens=100, num_computed=32)  # 7 blocks, 2 of them cached
    assert view.shortfall() == 2  # 5 needed, 3 free
    assert view.shortfall() == 0  # asked again next step, or not blocked any more
    fields = view.fields(pinned_blocks=6)
    assert fields["engine_free_blocks"] == 3 and fields["engine_total_blocks"] == 48
    assert fields["pinned_blocks"] == 6 and fields["prefill_ms_per_token"] is None


def test_a_worker_reports_released_pins_in_the_step_that_lets_them_go() -> None:
    client = ControlClient(None, socket_path="/nonexistent/agentpark.sock", timeout_s=0.01)
    config = SimpleNamespace(cache_config=SimpleNamespace(block_size=16))
    worker = WorkerSide(client, config, None, {})  # type: ignore[arg-type]
    assert worker.get_finished(StepPlan(release=["a", "b"])) == ({"a", "b"}, None)
    assert worker.get_finished(StepPlan()) == (None, None)


def test_pins_never_exceed_their_share_and_none_without_a_bound_pool(
    control_daemon: ControlDaemon,
) -> None:
    pins = Pins(control_daemon.client)
    assert pins.share == 0.25  # the daemon's default, said in hello
    assert not pins.fits(1, None)
    assert pins.fits(12, 48) and not pins.fits(13, 48)
    pins.book.add(_pin("r1", "s", list(range(10)), back_in=1.0))
    assert pins.fits(2, 48) and not pins.fits(3, 48)


def test_a_lost_daemon_is_a_new_generation_and_its_pins_are_let_go(
    control_daemon: ControlDaemon,
) -> None:
    client = ControlClient(None, socket_path=str(control_daemon.service.socket_path), timeout_s=5)
    try:
        assert client.call("degraded", counts={}) is not None  # connected
        assert client.probe() == 0  # open, nothing to read
        pins = Pins(client, clock=Clock())
        pins.book.add(_pin("r1", "s", [1, 2], back_in=1.0))
        plan = StepPlan()
        pins.tick(plan)
        assert plan.release == [] and pins.book.pins
        control_daemon.restart()
        assert client.probe() == 1  # the old connection's end of stream
        pins.tick(plan)
        assert plan.release == ["r1"] and not pins.book.pins
        assert pins.released == {"restart": 1}
        assert client.call("degraded", counts={}) is not None  # the new daemon answers
        assert client.probe() == 1
    finally:
        client.close()


def test_a_pin_past_its_deadline_is_let_go_at_the_next_step(
    control_daemon: ControlDaemon,
) -> None:
    clock = Clock()
    pins = Pins(control_daemon.client, clock=clock)
    pins.book.add(_pin("r1", "s", [1, 2], back_in=0.5, ttl=1.0))
    pins.book.add(_pin("r2", "t", [3], back_in=0.5, ttl=5.0))
    plan = StepPlan()
    clock.now += 0.9
    pins.tick(plan)
    assert plan.release == []
    clock.now += 0.2
    pins.tick(plan)
    assert plan.release == ["r1"] and list(pins.book.pins) == ["r2"]
    pins.close("shutdown", plan)
    assert plan.release == ["r1", "r2"] and not pins.book.pins
    assert pins.released == {"timeout": 1, "shutdown": 1}
