"""``agentpark bench agents`` runs every policy end to end on a tiny workload and checks itself."""

from __future__ import annotations

import io
import re
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from agentpark.bench import agents as bench
from agentpark.bench.agents import agent, plot
from agentpark.bench.agents.setup import make_setup
from agentpark.cli import main
from agentpark.config import ModelSettings
from tests.harness import wait_until

# Milliseconds of tool time and a model small enough to compile in a few seconds.
TINY = bench.WorkloadSpec(
    agents=3,
    turns=2,
    seed=7,
    time_scale=0.001,
    prompt_tokens=(24, 40),
    result_tokens=(4, 12),
    new_tokens=3,
)
TINY_MODEL = ModelSettings(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64)
COLUMNS = (
    "makespan s",
    "turns/s",
    "TTFT mean ms",
    "TTFT p99 ms",
    "peak agents in pool",
    "mean agents in pool",
    "HBM reclaimed MB·s",
)


def _run(**kwargs: Any) -> tuple[int, str]:
    out = io.StringIO()
    code = bench.run_agents_bench(
        kwargs.pop("spec", TINY),
        model=TINY_MODEL,
        console=Console(file=out, width=250),
        progress_console=Console(file=io.StringIO(), width=250),
        **kwargs,
    )
    return code, out.getvalue()


def _row(text: str, policy: str) -> list[str]:
    rows = [line for line in text.splitlines() if re.match(rf"│ {policy}\s+│", line)]
    assert len(rows) == 1, text
    return [cell.strip() for cell in rows[0].strip().strip("│").split("│")]


def test_tiny_bench_runs_all_four_policies_and_prints_their_metrics(tmp_path: Path) -> None:
    plot = tmp_path / "plot.png"
    code, text = _run(plot=plot)
    assert code == 0, text
    metrics, details = text.split("what the daemon did")
    for column in COLUMNS:
        assert column in metrics, metrics
    for policy in bench.POLICIES:
        cells = _row(metrics, policy)
        assert len(cells) == 1 + len(COLUMNS) + 1, cells  # policy, metrics, vs adaptive
        makespan, turns_per_s, ttft_mean, ttft_p99, peak = cells[1:6]
        assert float(makespan) > 0 and float(turns_per_s) > 0, cells
        assert float(ttft_p99) >= float(ttft_mean) >= 0, cells
        assert int(peak) >= 1, cells
        assert re.fullmatch(r"\d+\.\d\dx", cells[-1]), cells
    # The parking policies generated exactly keep-all's tokens (checked by the bench itself).
    for policy in bench.PARKING_POLICIES:
        assert _row(details, policy)[-1] == "yes", details
    assert _row(details, bench.ALWAYS_PARK)[1].startswith(f"{TINY.agents * (TINY.turns - 1)} /")
    assert len(re.findall(r"^target: adaptive .*\((met|NOT met)\)$", text, re.M)) == 3, text
    assert "FAIL" not in text
    if plot.exists():
        assert f"plot: {plot}" in text and plot.stat().st_size > 0
    else:
        assert "matplotlib is not installed" in text


def test_an_agent_that_does_not_finish_its_turns_fails_the_bench(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = agent.Agent._tool_starts

    def broken(self: agent.Agent, call: bench.ToolCall) -> None:
        if self.plan.index == 1:
            raise RuntimeError("the tool crashed")
        real(self, call)

    monkeypatch.setattr(agent.Agent, "_tool_starts", broken)
    code, text = _run(policies=[bench.ALWAYS_PARK])
    assert code == 1, text
    assert "FAIL always-park: agent 1: RuntimeError: the tool crashed" in text
    assert "agent 1 completed 1 of 2 turns" in text


def test_without_matplotlib_the_plot_is_skipped_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    setup = make_setup(TINY, TINY_MODEL, 16, tmp_path, tmp_path, 60.0, 0.05)
    note = plot.plot_pool([], tmp_path / "plot.png", setup)
    assert "matplotlib is not installed" in note
    assert not (tmp_path / "plot.png").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["--agents", "0"],
        ["--turns", "0"],
        ["--time-scale", "0"],
        ["--pool-ratio", "0.5"],
        ["--policies", "keep-all,always-nothing"],
    ],
)
def test_arguments_that_cannot_run_exit_2(argv: list[str]) -> None:
    assert main(["bench", "agents", *argv]) == 2


def test_the_workload_is_seeded_and_the_tools_do_not_depend_on_token_counts() -> None:
    plans = bench.make_workload(TINY)
    assert plans == bench.make_workload(TINY)
    assert plans != bench.make_workload(bench.WorkloadSpec(**{**vars(TINY), "seed": 8}))
    longer = bench.make_workload(bench.WorkloadSpec(**{**vars(TINY), "prompt_tokens": (50, 90)}))
    assert [[c.duration_s for c in p.calls] for p in plans] == [
        [c.duration_s for c in p.calls] for p in longer
    ]
    for plan in plans:
        assert len(plan.calls) == TINY.turns - 1
        assert plan.final_tokens == (
            len(plan.prompt) + sum(len(c.result) for c in plan.calls) + 2 * TINY.new_tokens
        )
        for call in plan.calls:
            cap = call.tool.cap * call.tool.median_s * TINY.time_scale
            assert 0 < call.duration_s <= cap
            assert (call.hint_s is not None) == call.tool.hinted


def _event(eid: int, sid: str, kind: str, at: float, **extra: Any) -> dict[str, Any]:
    return {"id": eid, "session_id": sid, "kind": kind, "at": at, **extra}


def test_pool_timeline_and_parked_bytes_from_events() -> None:
    t0 = 1000.0
    events = [
        _event(1, "a", "create", t0),
        _event(2, "a", "generate", t0 + 1.0, duration_ms=500.0),  # in the pool from 0.5
        _event(3, "b", "generate", t0 + 2.0, duration_ms=1000.0),  # from 1.0
        _event(4, "a", "pause", t0 + 3.0, bytes=100),  # a out at 3.0, parked
        _event(5, "a", "resume", t0 + 5.0, duration_ms=1000.0),  # a back from 4.0
        _event(6, "a", "generate", t0 + 6.0, duration_ms=100.0),  # still in: no change
        _event(7, "b", "keep", t0 + 6.5),
        _event(8, "b", "delete", t0 + 7.0),
        _event(9, "a", "delete", t0 + 8.0),
    ]
    timeline = bench.pool_timeline(list(reversed(events)), t0)
    assert timeline == [(0.0, 0), (0.5, 1), (1.0, 2), (3.0, 1), (4.0, 2), (7.0, 1), (8.0, 0)]
    assert bench.parked_byte_seconds(events, t0 + 9) == pytest.approx(100 * 1.0)
    # A parked copy that is never restored counts until the end of the run.
    assert bench.parked_byte_seconds(events[:4], t0 + 9) == pytest.approx(100 * 6.0)
    assert bench.time_average(timeline, 0.0, 8.0) == pytest.approx(
        (0.5 * 1 + 2 * 2 + 1 * 1 + 3 * 2 + 1 * 1) / 8.0
    )
    assert bench.undone_pressure_parks(events, 0.1) == 0  # a's pause was the agent's own


def test_a_pressure_park_undone_at_once_is_counted() -> None:
    events = [
        _event(1, "a", "pause", 10.0, reason="pressure"),
        _event(2, "a", "resume", 10.08, duration_ms=30.0, reason="generate"),  # back at 10.05
        _event(3, "b", "pause", 10.0, reason="pressure"),
        _event(4, "b", "resume", 11.0, duration_ms=10.0, reason="generate"),  # 1 s later
        _event(5, "c", "pause", 10.0, reason="pressure"),
        _event(6, "c", "delete", 10.01),
    ]
    assert bench.undone_pressure_parks(events, 0.1) == 1
    assert bench.undone_pressure_parks(events, 2.0) == 2


def test_keep_all_admission_is_first_come_first_served() -> None:
    budget = bench.BlockBudget(10)
    stop = threading.Event()
    budget.acquire(6, stop)
    order: list[str] = []

    def take(name: str, n: int) -> None:
        budget.acquire(n, stop)
        order.append(name)

    big = threading.Thread(target=take, args=("big", 8))
    big.start()
    wait_until(lambda: len(budget._queue) == 1)
    small = threading.Thread(target=take, args=("small", 2))  # fits, but must not overtake
    small.start()
    wait_until(lambda: len(budget._queue) == 2)
    assert order == []
    budget.release(6)
    big.join(timeout=10)
    wait_until(lambda: order == ["big", "small"])
    small.join(timeout=10)
    assert budget.free == 0
