"""``agentpark vllm demo`` end to end on the tiny model: two vLLM servers (with agentpark,
then plain, the same small KV cache), once for the module. What it returns and prints:
turns restored from agentpark's pool, every turn in the table, nothing from agentpark in
the plain run, and nothing left running or in /dev/shm afterwards."""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from agentpark.bench.vllm.demo import DemoResult, demo_spec, run_demo

SHM = Path("/dev/shm")
POOL_PREFIX = "agentpark-bench-vllm-"  # the demo's daemon's pool folder (BenchDaemon)
TMP_PREFIX = "agentpark-demo-"  # the demo's work folder (model, logs, daemon state)


@dataclass
class Ran:
    result: DemoResult
    out: str
    shm_before: set[str]
    tmp_before: set[str]
    children_before: set[int]


def _names(folder: Path, prefix: str) -> set[str]:
    return {p.name for p in folder.iterdir() if p.name.startswith(prefix)}


@pytest.fixture(scope="module")
def ran(tiny_model: Path) -> Ran:
    tmp = Path(tempfile.gettempdir())
    shm_before, tmp_before = _names(SHM, POOL_PREFIX), _names(tmp, TMP_PREFIX)
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = run_demo(tiny_model, demo_spec())
    return Ran(result, out.getvalue(), shm_before, tmp_before, children)


def test_turns_are_restored_from_agentpark(ran: Ran) -> None:
    result = ran.result
    assert result.code == 0, ran.out
    assert result.kv is not None and result.kv.problems == ()
    restored = [r for r in result.rows if r.with_agentpark.agentpark_tokens > 0]
    assert restored, ran.out
    for row in restored:
        assert row.turn > 0  # nothing is parked before a first turn
        assert row.with_agentpark.tier in ("shm", "dram", "disk")
        assert row.with_agentpark.cached_tokens >= row.with_agentpark.agentpark_tokens
    assert "agentpark shm" in ran.out or "agentpark dram" in ran.out
    with_computed = sum(r.with_agentpark.computed for r in result.rows)
    plain_computed = sum(r.without.computed for r in result.rows)
    assert with_computed < plain_computed, ran.out
    assert f"{with_computed:,} with agentpark, {plain_computed:,} without" in ran.out


def test_the_table_has_every_turn(ran: Ran) -> None:
    spec = demo_spec()
    expected = [(a, t) for a in range(spec.agents) for t in range(spec.turns)]
    assert [(r.agent, r.turn) for r in ran.result.rows] == expected
    lines = [line for line in ran.out.splitlines() if line.startswith("agent-")]
    assert len(lines) == len(expected)
    assert "median TTFT after a tool:" in ran.out
    assert all(r.with_agentpark.error is None and r.without.error is None for r in ran.result.rows)


def test_the_plain_run_restored_nothing_from_agentpark(ran: Ran) -> None:
    plain = ran.result.runs[1]
    assert plain.name == "plain" and plain.host == {}  # no daemon beside it
    assert all(r.without.agentpark_tokens == 0 for r in ran.result.rows)
    assert all(t.restored_bytes == 0 for t in plain.turns)
    # Evicted sessions were computed again there: some turn after a tool recomputed more
    # than the same turn with agentpark.
    assert any(r.without.computed > r.with_agentpark.computed for r in ran.result.rows)


def test_nothing_is_left_running(ran: Ran) -> None:
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    assert children <= ran.children_before
    assert _names(SHM, POOL_PREFIX) <= ran.shm_before
    assert _names(Path(tempfile.gettempdir()), TMP_PREFIX) <= ran.tmp_before
    assert not any(
        "agentpark" in " ".join(p.info["cmdline"] or [])
        and p.info["ppid"] == os.getpid()
        and p.pid not in ran.children_before  # other modules' servers, alive for the session
        for p in psutil.process_iter(["cmdline", "ppid"])
    )
