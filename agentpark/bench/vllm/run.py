"""``run_vllm_bench``: make the model and the workload, then each run on a fresh vLLM
server (and daemon): the reference, plain, and one agentpark run per client; then the
report (agentpark.bench.vllm's docstring says what)."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from agentpark.bench.vllm.compare import decisions, failed, mark_restored
from agentpark.bench.vllm.daemon import BenchDaemon
from agentpark.bench.vllm.drive import Clock, drive
from agentpark.bench.vllm.repeats import save
from agentpark.bench.vllm.report import print_noise, print_report
from agentpark.bench.vllm.results import RunResult, TurnResult
from agentpark.bench.vllm.spec import (
    BLOCK_SIZE,
    DEFAULT_RUNS,
    RUNS,
    TURN_ENDS,
    VllmBenchSpec,
    daemon_env,
    kv_bytes_per_token,
)
from agentpark.bench.vllm.workload import AgentPlan, make_plans, prompt_tokens
from agentpark.vllm_tools.process import VllmServer, free_port

# What a caller reads from the daemon after a run, before it stops (the demo: its turns).
Look = Callable[[BenchDaemon, list[TurnResult]], None]

__all__ = ["Look", "run_one", "run_order", "run_vllm_bench"]


def run_one(
    name: str,
    client: str,
    model: Path,
    work: Path,
    plans: list[AgentPlan],
    spec: VllmBenchSpec,
    blocks: int,
    clock: Clock,
    look: Look | None = None,
) -> RunResult:
    """One run on a fresh vLLM server (and daemon for ``agentpark``), stopped on every
    path; ``look`` sees the daemon and the turns while the daemon still answers."""
    daemon: BenchDaemon | None = None
    server: VllmServer | None = None
    env = {"VLLM_CPU_KVCACHE_SPACE": str(spec.reference_kv_gib)}
    extra: tuple[str, ...] = ("--max-model-len", str(spec.max_model_len))
    if spec.max_num_seqs is not None:
        extra += ("--max-num-seqs", str(spec.max_num_seqs))
    try:
        if name in TURN_ENDS:
            state = work / f"daemon-state-{name}-{client}"
            state.mkdir()
            kv_bytes = kv_bytes_per_token(spec) * (spec.max_model_len + BLOCK_SIZE)
            settings = daemon_env(name, spec)  # the daemon's; ``env`` is vLLM's
            daemon = BenchDaemon(state, 2 * kv_bytes * spec.agents, spec.time_scale, settings)
            told = " ".join(f"{k}={v}" for k, v in settings.items()) or "its default turn end"
            clock.say(f"{name}: starting the daemon ({daemon.url}, {told})")
            daemon.wait_ready()
        server = VllmServer(
            python=Path(sys.executable),
            model=model,
            port=free_port(),
            log_path=work / f"vllm-{name}-{client}.log",
            daemon_url=daemon.url if daemon else None,
            num_gpu_blocks=None if name == "reference" else blocks,
            extra_args=extra,
            env=env,
        )
        where = "room for every agent" if name == "reference" else f"{blocks} blocks"
        clock.say(f"{name}: starting vLLM ({where})")
        server.start()
        clock.say(f"{name}: {len(plans)} x {spec.turns} turns, {client} client")
        before = daemon.host() if daemon else {}
        makespan, turns = asyncio.run(drive(server, plans, spec, client, clock))
        host = daemon.host() if daemon else {}
        events = daemon.events() if daemon else []
        # An anonymous session (the none client) has no name to find its events by.
        mark_restored(turns, events, [plan.session_id for plan in plans])
        if daemon is not None and look is not None:
            look(daemon, turns)
        return RunResult(name, makespan, turns, host, decisions(events), client, before)
    finally:
        if server is not None:
            server.stop()
        if daemon is not None:
            daemon.stop()


def run_order(runs: Sequence[str], clients: Sequence[str]) -> list[tuple[str, str]]:
    """(run, client) in the bench's order: plain vLLM (reference, plain) is sent the
    messages only, as an unchanged client sends them; each agentpark run (a turn-end rule)
    once per client."""
    order: list[tuple[str, str]] = []
    for name in [r for r in RUNS if r in runs]:
        order += [(name, c) for c in clients] if name in TURN_ENDS else [(name, "none")]
    return order


def run_vllm_bench(
    spec: VllmBenchSpec,
    runs: Sequence[str] = DEFAULT_RUNS,
    model: Path | None = None,
    save_to: Path | None = None,
) -> int:
    """Run the bench (``spec.repeats`` times) and print its tables; 1 if a request failed
    or agentpark's tokens differ, 2 for flags it cannot run (nothing started).
    ``save_to``: every repeat's turns as JSON (agentpark.bench.vllm.repeats)."""
    unknown = [r for r in runs if r not in RUNS]
    problems = spec.problems()
    if unknown or not runs:
        problems.insert(0, f"unknown runs {unknown}; choose from {RUNS}")
    if problems:
        for problem in problems:
            print(f"agentpark bench vllm: {problem}", file=sys.stderr)
        return 2
    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="agentpark-bench-vllm-") as tmp:
        work = Path(tmp)
        from transformers import AutoTokenizer

        if model is None:
            from agentpark.vllm_tools.model import ModelSpec, make_model

            clock.say(f"making the model ({spec.layers} layers, hidden {spec.hidden})")
            model = make_model(
                work / "model",
                ModelSpec(
                    layers=spec.layers,
                    hidden=spec.hidden,
                    heads=spec.heads,
                    max_positions=spec.max_model_len,
                    seed=spec.seed,
                ),
                progress=lambda line: clock.say(f"  {line}"),
            )
        tokenizer = AutoTokenizer.from_pretrained(model)
        plans = make_plans(spec, tokenizer)
        longest = max(prompt_tokens(plan, tokenizer) for plan in plans)
        if longest + spec.new_tokens > spec.max_model_len:
            print(
                f"agentpark bench vllm: the longest prompt takes about {longest} tokens, "
                f"+{spec.new_tokens} new ones: more than --max-model-len {spec.max_model_len}",
                file=sys.stderr,
            )
            return 2
        blocks = spec.small_blocks()
        clock.say(
            f"workload {spec.workload}: {spec.agents} x {spec.turns} turns, seed {spec.seed}, "
            f"longest prompt ~{longest} tokens"
        )
        repeats: list[list[RunResult]] = []
        for repeat in range(spec.repeats):
            if spec.repeats > 1:
                clock.say(f"repeat {repeat + 1} of {spec.repeats}")
            results = []
            here = work / f"repeat-{repeat}"  # each repeat's daemons and logs apart
            here.mkdir()
            for name, client in run_order(runs, spec.clients):
                results.append(run_one(name, client, Path(model), here, plans, spec, blocks, clock))
                clock.say(f"{results[-1].label}: done in {results[-1].makespan_s:.1f} s")
            repeats.append(results)
            if save_to is not None:  # after each repeat: a stopped bench keeps what it ran
                save(save_to, spec, blocks, repeats)
    for results in repeats:
        print_report(results, spec, blocks)
    if len(repeats) > 1:
        print_noise(repeats)
    return 1 if any(failed(results, spec) for results in repeats) else 0
