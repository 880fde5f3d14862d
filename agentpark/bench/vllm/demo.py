"""``agentpark vllm demo``: the effect of agentpark on vLLM in about two minutes.

A few agents (3 x 3 turns by default, seeded) run tool calls with pauses of a second or two
against one vLLM server whose KV cache holds about one of them (demo_kv chooses it and
checks it before anything starts), first with agentpark (a daemon in vLLM mode and the
connector), then the same requests against plain vLLM with the same KV cache and the same
environment (``agentpark vllm serve --no-connector``). Each run is ``agentpark bench
vllm``'s (run_one: a fresh server, and daemon, stopped on every path); what agentpark
restored into each turn is the daemon's own account of it (``GET
/v1/sessions/{id}/turns``, matched by the request id the client saw). Printed: the
per-turn table and two summary lines (demo_table). Without a MODEL it makes the bench's
random-weight model in a temporary directory (no download): its answers are noise, its
prefill costs what a real one of its size costs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from agentpark.bench.vllm.daemon import BenchDaemon
from agentpark.bench.vllm.demo_kv import KvChoice, choose_kv, model_shape
from agentpark.bench.vllm.demo_table import DemoRow, render, rows_of, summary
from agentpark.bench.vllm.drive import Clock
from agentpark.bench.vllm.results import RunResult, TurnResult
from agentpark.bench.vllm.run import run_one
from agentpark.bench.vllm.spec import BLOCK_SIZE, VllmBenchSpec
from agentpark.bench.vllm.workload import AgentPlan, make_plans, prompt_tokens
from agentpark.turns import sees

__all__ = ["DemoResult", "demo_spec", "run_demo"]


DEMO_TOOLS: dict[str, tuple[float, float]] = {
    "web_search": (6.0, 0.5),
    "run_tests": (3.0, 0.4),
    "read_file": (1.0, 0.3),
    "ask_human": (12.0, 0.6),
}
"""The demo's tools: the bench's, with a person who answers sooner (12 s, not 24 s),
so three agents' three turns end in about two minutes (its seed draws fixed pauses)."""


def demo_spec(agents: int = 3, turns: int = 3, seed: int = 4) -> VllmBenchSpec:
    """The demo's workload: first prompts of 1000-1400 tokens (whole blocks to park from
    the first answer on), tool results of 150-300, the bench's tools at 0.3x their median
    pauses (read_file's 0.3 s stays under the policy's 0.6 s ``min_pause_s``: kept, not
    parked); seed 4 draws pauses of 0.3-1.5 s and one ask_human of 4.9 s. The model the
    demo makes: the bench's (8 layers, hidden 512), whose prefill shows in a TTFT."""
    return VllmBenchSpec(
        agents=agents,
        turns=turns,
        seed=seed,
        context=(1000, 1400),
        result=(150, 300),
        time_scale=0.3,
        reference_kv_gib=1,  # the servers' memory for KV; the blocks are what the demo chose
        tools=dict(DEMO_TOOLS),
    )


@dataclass
class DemoResult:
    code: int  # 0, 1 (a request failed), 2 (nothing started: the KV space would show nothing)
    rows: list[DemoRow] = field(default_factory=list)
    kv: KvChoice | None = None
    runs: list[RunResult] = field(default_factory=list)
    seconds: float = 0.0


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so every server, daemon and /dev/shm folder is stopped
    and removed on that path too (in the main thread; elsewhere signals cannot be set)."""

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _turns_of(url: str, session_id: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{url}/v1/sessions/{session_id}/turns", params={"limit": 1000}, timeout=30)
    if answer.status_code == 404:  # a session that never reached the daemon
        return []
    answer.raise_for_status()
    turns: list[dict[str, Any]] = answer.json()["turns"]
    return turns


def restored_by_turn(
    url: str, plans: Sequence[AgentPlan], turns: Sequence[TurnResult]
) -> dict[tuple[int, int], tuple[int, str | None]]:
    """(agent, turn) -> (tokens agentpark restored, from which tier), as the daemon
    recorded each request (its turns name the engine's id, which extends the client's)."""
    found: dict[tuple[int, int], tuple[int, str | None]] = {}
    for agent, plan in enumerate(plans):
        recorded = _turns_of(url, plan.session_id)
        for turn in (t for t in turns if t.agent == agent and t.request_id):
            match = next((r for r in recorded if sees(turn.request_id, r["request_id"])), None)
            if match is not None and match["restored_tokens"]:
                found[(agent, turn.turn)] = (int(match["restored_tokens"]), match["restored_from"])
    return found


def _make_model(work: Path, spec: VllmBenchSpec, clock: Clock) -> Path:
    from agentpark.vllm_tools.model import ModelSpec, make_model

    clock.say(f"making a small model ({spec.layers} layers, hidden {spec.hidden}; no download)")
    shape = ModelSpec(layers=spec.layers, hidden=spec.hidden, heads=spec.heads, seed=spec.seed)
    return make_model(work / "model", shape, progress=lambda line: clock.say(f"  {line}"))


def _choose(model: Path, plans: list[AgentPlan], spec: VllmBenchSpec) -> KvChoice:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    firsts = [prompt_tokens(AgentPlan(p.session_id, p.messages, []), tokenizer) for p in plans]
    lasts = [prompt_tokens(p, tokenizer) for p in plans]
    return choose_kv(firsts, lasts, spec.new_tokens, model_shape(model)[3])


def _plans(model: Path, spec: VllmBenchSpec) -> list[AgentPlan]:
    from transformers import AutoTokenizer

    return make_plans(spec, AutoTokenizer.from_pretrained(model))


def run_demo(model: Path | None, spec: VllmBenchSpec | None = None) -> DemoResult:
    """Both runs, the table and the summary on stdout (progress on stderr)."""
    spec = spec or demo_spec()
    clock = Clock()
    with _sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="agentpark-demo-") as tmp:
        work = Path(tmp)
        model = Path(model) if model is not None else _make_model(work, spec, clock)
        plans = _plans(model, spec)
        kv = _choose(model, plans, spec)
        if kv.problems:
            for problem in kv.problems:
                print(f"agentpark vllm demo: {problem}", file=sys.stderr)
            return DemoResult(2, kv=kv)
        layers, kv_heads, head_dim, _ = model_shape(model)
        # The spec's shape sizes the daemon's pool (run_one): the model's KV per token.
        spec = replace(
            spec,
            max_model_len=kv.max_model_len,
            blocks=kv.blocks,
            layers=layers,
            heads=kv_heads,
            hidden=kv_heads * head_dim,
        )
        clock.say(
            f"KV cache: {kv.blocks} blocks of {BLOCK_SIZE} tokens, --max-model-len "
            f"{kv.max_model_len} (one session at its longest); the {spec.agents} sessions' "
            f"first prompts alone take {kv.first_blocks} blocks, so vLLM evicts"
        )
        restored: dict[tuple[int, int], tuple[int, str | None]] = {}

        def look(daemon: BenchDaemon, turns: list[TurnResult]) -> None:
            restored.update(restored_by_turn(daemon.url, plans, turns))

        runs = [run_one("agentpark", "agentpark", model, work, plans, spec, kv.blocks, clock, look)]
        clock.say(f"with agentpark: done in {runs[0].makespan_s:.1f} s")
        runs.append(run_one("plain", "none", model, work, plans, spec, kv.blocks, clock))
        clock.say(f"plain vLLM: done in {runs[1].makespan_s:.1f} s")
    rows = rows_of(runs[0], runs[1], restored)
    seconds = time.monotonic() - clock.started
    print(render(rows))
    print()
    for line in summary(rows):
        print(line)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"({seconds:.0f} s in all; load average {load}; seed {spec.seed})")
    failed = any(r.errors() for r in runs)
    return DemoResult(1 if failed else 0, rows, kv, runs, seconds)
