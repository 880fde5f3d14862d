"""``agentpark bench vllm``: agents on one real vLLM server whose KV cache is too small for
them all: plain vLLM, vLLM with agentpark, and a roomy plain reference.

**Workload** (seeded; the same requests in every run). N agents start together. Agent *i*
sends a system prompt and a task (``context`` tokens of standard-library text in all, drawn
per agent), then plays ``turns`` turns: a turn is one streamed, greedy chat completion of
``new_tokens`` tokens (``ignore_eos``); between two turns the agent runs a tool: the client
writes the assistant's tool call itself (a random-weight model never emits a parseable one,
and an orchestrator replays the same), waits the tool's drawn pause (log-normal around the
tool's median, times ``time_scale``) and appends the tool's result (``result`` tokens of
text). The model's own answers are recorded, not fed back, so every run sends the very same
prompts and the tokens of a turn can be compared across runs. Each request names its
session in ``kv_transfer_params.agentpark`` with the tool that follows and its median as
``expected_resume_s`` (ignored by plain vLLM).

**Runs.** ``reference``: plain vLLM, prefix caching on, a KV cache with room for every
agent: its cache hits are the exact keep-all. ``plain``: the same under pressure
(``--num-gpu-blocks-override``, default: room for about 1.5 agents at their longest): idle
agents' blocks are evicted and recomputed. ``agentpark``: the same pressure with agentpark's
connector and a daemon in vLLM mode (a child process, temporary state dir and pool):
parked sessions are restored instead. Each run gets a fresh server (and daemon).

**Figures** per run: prefill tokens computed (sum of ``usage.prompt_tokens -
prompt_tokens_details.cached_tokens``), p50/p99 time to first token of the turns after a
tool returned (from the end of the pause to the first streamed token), makespan (first
request to last answer), bytes parked and restored (the daemon's ``/v1/host`` counters), and
turns whose tokens differ from the reference's (tokens, then logprobs to the bit). Plain's
recomputed turns may differ by rounding (batched prefill and decode round differently):
they are counted, not hidden; so are agentpark's later turns that vLLM computed (a kept
session whose blocks it evicted). Which turns agentpark restored comes from the daemon's
``resume`` events. Batched (vLLM's default ``--max-num-seqs``) the servers batch the same
requests differently, and that alone moves logprobs and now and then a greedy token, first
turns included (nothing cached or restored there): those differences are printed per kind
of turn, not judged. ``--max-num-seqs 1`` runs one request at a time, so every run batches
alike: the exactness check, where a restored turn must equal the reference to the bit. The
bench exits 1 when a request failed or, in that mode, a restored turn differs.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentpark.vllm_tools.process import VllmServer, free_port

__all__ = ["RUNS", "RunResult", "TurnResult", "VllmBenchSpec", "run_vllm_bench"]

RUNS = ("reference", "plain", "agentpark")
BLOCK_SIZE = 128  # vLLM's CPU KV block size (tokens)

# Tool -> (median pause in seconds before time_scale, log-normal sigma).
TOOLS: dict[str, tuple[float, float]] = {
    "web_search": (6.0, 0.5),
    "run_tests": (3.0, 0.4),
    "read_file": (1.0, 0.3),
    "ask_human": (12.0, 0.6),
}


@dataclass(frozen=True)
class VllmBenchSpec:
    agents: int = 6
    turns: int = 4
    seed: int = 0
    context: tuple[int, int] = (1000, 2000)  # first prompt, tokens
    result: tuple[int, int] = (150, 500)  # each tool result, tokens
    new_tokens: int = 16
    time_scale: float = 0.5
    blocks: int | None = None  # the small KV cache; None: ~1.5 agents at their longest
    layers: int = 8
    hidden: int = 512
    heads: int = 8
    max_model_len: int = 4096
    reference_kv_gib: int = 2
    # vLLM's --max-num-seqs for every run; 1: the runs batch alike (the exactness check).
    max_num_seqs: int | None = None

    @property
    def exact(self) -> bool:
        """Whether every run batches alike, so turns compare to the bit: with one request
        at a time. Otherwise the servers batch the same requests differently and even the
        first turns (nothing cached or restored) may differ in their last bits."""
        return self.max_num_seqs == 1


@dataclass
class Step:
    """What follows a turn: the tool the agent runs, how long it takes, what it returns."""

    tool: str
    median_s: float
    pause_s: float
    call_id: str
    arguments: str
    result: str


@dataclass
class AgentPlan:
    session_id: str
    messages: list[dict[str, Any]]  # system + user
    steps: list[Step]  # one per turn but the last


@dataclass
class TurnResult:
    agent: int
    turn: int
    after_tool: bool
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    tokens: list[str]
    logprobs: list[float]
    error: str | None = None
    # Bytes agentpark restored into this turn (from the daemon's events after the run:
    # streamed responses carry no kv_transfer_params in vLLM 0.32).
    restored_bytes: int = 0


@dataclass
class RunResult:
    name: str
    makespan_s: float
    turns: list[TurnResult]
    host: dict[str, Any] = field(default_factory=dict)
    decisions: dict[str, int] = field(default_factory=dict)

    @property
    def prefill_computed(self) -> int:
        return sum(t.prompt_tokens - t.cached_tokens for t in self.turns)

    def ttfts(self) -> list[float]:
        return [t.ttft_s for t in self.turns if t.after_tool and t.error is None]

    def errors(self) -> list[TurnResult]:
        return [t for t in self.turns if t.error is not None]


class _Clock:
    def __init__(self) -> None:
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {text}", file=sys.stderr, flush=True)


# ---- the workload -------------------------------------------------------------------------


def _text(tokenizer: Any, rng: random.Random, files: Sequence[Path], tokens: int) -> str:
    """About ``tokens`` tokens of standard-library text from a seeded place."""
    pieces: list[str] = []
    have = 0
    while have < tokens:
        path = files[rng.randrange(len(files))]
        text = path.read_text(encoding="utf-8", errors="replace")
        start = rng.randrange(max(1, len(text) - 4000))
        ids = tokenizer.encode(text[start : start + 6 * (tokens - have)], add_special_tokens=False)
        ids = ids[: tokens - have]
        pieces.append(tokenizer.decode(ids))
        have += len(ids)
    return "".join(pieces)


def make_plans(spec: VllmBenchSpec, tokenizer: Any) -> list[AgentPlan]:
    """Every agent's prompts, tools, pauses and results: a function of the seed only."""
    from agentpark.vllm_tools.model import corpus_files

    files = corpus_files()
    rng = random.Random(spec.seed)
    names = sorted(TOOLS)
    plans = []
    for agent in range(spec.agents):
        session = f"bench-agent-{agent}"
        context = rng.randint(*spec.context)
        system = f"Agent {agent}. You edit Python code with tools: {', '.join(names)}.\n"
        system += _text(tokenizer, rng, files, context - 60)
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Task {agent}: make the tests pass."},
        ]
        steps = []
        for turn in range(spec.turns - 1):
            tool = names[rng.randrange(len(names))]
            median, sigma = TOOLS[tool]
            pause = min(median * math.exp(rng.gauss(0.0, sigma)), 4 * median)
            steps.append(
                Step(
                    tool=tool,
                    median_s=median * spec.time_scale,
                    pause_s=pause * spec.time_scale,
                    call_id=f"call_{agent}_{turn}",
                    arguments=json.dumps({"query": f"step {turn} of agent {agent}"}),
                    result=_text(tokenizer, rng, files, rng.randint(*spec.result)),
                )
            )
        plans.append(AgentPlan(session, messages, steps))
    return plans


# ---- one run ------------------------------------------------------------------------------


async def _turn(
    client: Any,
    model: str,
    plan: AgentPlan,
    messages: list[dict[str, Any]],
    turn: int,
    spec: VllmBenchSpec,
    ready_at: float,
    agent: int,
) -> TurnResult:
    hint: dict[str, Any] = {"session_id": plan.session_id}
    if turn < len(plan.steps):
        step = plan.steps[turn]
        hint |= {"tool": step.tool, "expected_resume_s": step.median_s}
    first: float | None = None
    tokens: list[str] = []
    logprobs: list[float] = []
    usage: Any = None
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=spec.new_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            logprobs=True,
            extra_body={"ignore_eos": True, "kv_transfer_params": {"agentpark": hint}},
        )
        async for chunk in stream:
            for choice in chunk.choices:
                content = choice.logprobs.content if choice.logprobs else None
                if content:
                    if first is None:
                        first = time.monotonic()
                    tokens += [c.token for c in content]
                    logprobs += [c.logprob for c in content]
            if chunk.usage is not None:
                usage = chunk.usage
    except Exception as exc:  # counted and printed; the bench exits 1
        return TurnResult(agent, turn, turn > 0, 0.0, 0, 0, [], [], error=repr(exc))
    if usage is None or first is None:
        return TurnResult(agent, turn, turn > 0, 0.0, 0, 0, tokens, logprobs, error="no usage")
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    return TurnResult(
        agent,
        turn,
        turn > 0,
        first - ready_at,
        usage.prompt_tokens,
        cached,
        tokens,
        logprobs,
    )


async def _agent(
    client: Any,
    model: str,
    plan: AgentPlan,
    spec: VllmBenchSpec,
    agent: int,
    done: list[TurnResult],
    clock: _Clock,
    total: int,
) -> None:
    messages = [dict(m) for m in plan.messages]
    ready_at = time.monotonic()
    for turn in range(spec.turns):
        result = await _turn(client, model, plan, messages, turn, spec, ready_at, agent)
        done.append(result)
        if len(done) % max(1, total // 10) == 0 or len(done) == total:
            clock.say(f"  {len(done)}/{total} turns answered")
        if turn == len(plan.steps):
            return
        step = plan.steps[turn]
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": step.call_id,
                        "type": "function",
                        "function": {"name": step.tool, "arguments": step.arguments},
                    }
                ],
            }
        )
        await asyncio.sleep(step.pause_s)  # the tool runs
        messages.append({"role": "tool", "tool_call_id": step.call_id, "content": step.result})
        ready_at = time.monotonic()


async def _drive(
    server: VllmServer, plans: list[AgentPlan], spec: VllmBenchSpec, clock: _Clock
) -> tuple[float, list[TurnResult]]:
    from openai import AsyncOpenAI

    done: list[TurnResult] = []
    total = sum(len(p.steps) + 1 for p in plans)
    async with AsyncOpenAI(
        base_url=server.base_url, api_key="unused", max_retries=0, timeout=1800
    ) as client:
        (model,) = [m.id async for m in client.models.list()]
        started = time.monotonic()
        await asyncio.gather(
            *(_agent(client, model, p, spec, i, done, clock, total) for i, p in enumerate(plans))
        )
        return time.monotonic() - started, sorted(done, key=lambda t: (t.agent, t.turn))


class _Daemon:
    """``agentpark serve`` in vLLM mode: a child process, a free port, a temporary state dir."""

    def __init__(self, state_dir: Path, pool_bytes: int, time_scale: float) -> None:
        self.shm_dir = Path(tempfile.mkdtemp(prefix="agentpark-bench-vllm-", dir="/dev/shm"))
        self.pool_path = self.shm_dir / "pool"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = state_dir / "bench.toml"
        config.write_text(
            f'state_dir = "{state_dir}"\nlog_level = "info"\n'
            f"[server]\nport = {self.port}\n"
            f"[vllm]\nenabled = true\npool_capacity = {pool_bytes}\n"
            f'pool_path = "{self.pool_path}"\n'
            # The policy's own times scale with the workload's, as the pauses do.
            f"[policy]\nidle_pause_after_s = 0\nmin_pause_s = {2.0 * time_scale}\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPARK_")}
        self.log_path = state_dir / "daemon.log"
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentpark", "serve", "--config", str(config)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            if b"Application startup complete" in line:
                self._ready.set()
        self._ready.set()
        self._log.close()

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        self._ready.wait(timeout_s)
        if self.proc.poll() is not None or not self._ready.is_set():
            tail = self.log_path.read_text(errors="replace").splitlines()[-30:]
            raise RuntimeError("the daemon did not start:\n" + "\n".join(tail))

    def host(self) -> dict[str, Any]:
        answer: dict[str, Any] = httpx.get(f"{self.url}/v1/host", timeout=30).json()
        return answer

    def events(self) -> list[dict[str, Any]]:
        """Every event of the run (a bench run makes far fewer than the page's 10,000)."""
        answer = httpx.get(f"{self.url}/v1/events", params={"limit": 10_000}, timeout=30)
        answer.raise_for_status()
        events: list[dict[str, Any]] = answer.json()["events"]
        return events

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.shm_dir, ignore_errors=True)  # the pool: no /dev/shm file left


def _run(
    name: str,
    model: Path,
    work: Path,
    plans: list[AgentPlan],
    spec: VllmBenchSpec,
    blocks: int,
    clock: _Clock,
) -> RunResult:
    daemon: _Daemon | None = None
    server: VllmServer | None = None
    env = {"VLLM_CPU_KVCACHE_SPACE": str(spec.reference_kv_gib)}
    extra: tuple[str, ...] = ("--max-model-len", str(spec.max_model_len))
    if spec.max_num_seqs is not None:
        extra += ("--max-num-seqs", str(spec.max_num_seqs))
    try:
        if name == "agentpark":
            state = work / "daemon-state"
            state.mkdir()
            kv_bytes = _kv_bytes_per_token(spec) * (spec.max_model_len + BLOCK_SIZE)
            daemon = _Daemon(state, 2 * kv_bytes * spec.agents, spec.time_scale)
            clock.say(f"{name}: starting the daemon ({daemon.url})")
            daemon.wait_ready()
        server = VllmServer(
            python=Path(sys.executable),
            model=model,
            port=free_port(),
            log_path=work / f"vllm-{name}.log",
            daemon_url=daemon.url if daemon else None,
            num_gpu_blocks=None if name == "reference" else blocks,
            extra_args=extra,
            env=env,
        )
        where = "room for every agent" if name == "reference" else f"{blocks} blocks"
        clock.say(f"{name}: starting vLLM ({where})")
        server.start()
        clock.say(f"{name}: {len(plans)} agents x {spec.turns} turns")
        makespan, turns = asyncio.run(_drive(server, plans, spec, clock))
        host = daemon.host() if daemon else {}
        events = daemon.events() if daemon else []
        mark_restored(turns, events, [plan.session_id for plan in plans])
        return RunResult(name, makespan, turns, host, decisions(events))
    finally:
        if server is not None:
            server.stop()
        if daemon is not None:
            daemon.stop()


def _kv_bytes_per_token(spec: VllmBenchSpec) -> int:
    head_dim = spec.hidden // spec.heads
    return spec.layers * 2 * spec.heads * head_dim * 2  # K and V, bfloat16


# ---- the report ---------------------------------------------------------------------------


def _differs(run: RunResult, reference: RunResult) -> tuple[int, int]:
    """(turns whose tokens differ, turns whose logprobs differ) from the reference's."""
    ref = {(t.agent, t.turn): t for t in reference.turns}
    tokens = logprobs = 0
    for turn in run.turns:
        other = ref.get((turn.agent, turn.turn))
        if other is None or turn.error or other.error:
            continue
        tokens += turn.tokens != other.tokens
        logprobs += turn.logprobs != other.logprobs
    return tokens, logprobs


def mark_restored(
    turns: Sequence[TurnResult], events: Sequence[dict[str, Any]], ids: Sequence[str]
) -> None:
    """Set each turn's ``restored_bytes`` from the daemon's events of the agents' sessions
    (``ids[agent]``): a ``resume`` event belongs to the turn after as many ``turn`` events
    of its session as came before it (a turn's end is reported when it finishes; the
    restore runs before its first token)."""
    agent_of = {session_id: agent for agent, session_id in enumerate(ids)}
    restored: dict[tuple[int, int], int] = {}
    ended: dict[int, int] = {}
    for event in sorted(events, key=lambda e: int(e["id"])):
        agent = agent_of.get(str(event.get("session_id")))
        if agent is None:
            continue
        if event.get("kind") == "turn":
            ended[agent] = ended.get(agent, 0) + 1
        elif event.get("kind") == "resume":
            key = (agent, ended.get(agent, 0))
            restored[key] = restored.get(key, 0) + int(event.get("bytes") or 0)
    for turn in turns:
        turn.restored_bytes = restored.get((turn.agent, turn.turn), 0)


def decisions(events: Sequence[dict[str, Any]]) -> dict[str, int]:
    """What the daemon did at the turn ends, counted: parked, and kept by reason."""
    counts: dict[str, int] = {}
    for event in events:
        if event.get("kind") == "pause":
            label = "parked"
        elif event.get("kind") == "keep":
            why = str(event.get("detail") or "")
            label = "kept: " + (why.split(" (")[0] if "break-even" not in why else "short pause")
        elif event.get("kind") == "pause_failed":
            label = "park failed"
        else:
            continue
        counts[label] = counts.get(label, 0) + 1
    return counts


RESTORED = "restored turns"
RESTORED_AFTER_RECOMPUTE = "restored after a recompute"


def _computed(turn: TurnResult) -> int:
    return turn.prompt_tokens - turn.cached_tokens


def breakdown(run: RunResult, reference: RunResult) -> dict[str, tuple[int, int, int]]:
    """Per kind of turn, (tokens differ, logprobs differ, turns compared) against the
    reference:

    - first turns: nothing cached or restored in any run; a difference there is the
      servers' own batching, not a parked copy;
    - restored turns: agentpark restored blocks into the turn, and vLLM computed as many
      prompt tokens as the reference did in this turn and every earlier one of the agent,
      so the session's KV was built the same way: with one request at a time these must
      equal the reference to the bit;
    - restored after a recompute: restored, but vLLM computed a different number of
      tokens in this turn or an earlier one (it recomputed evicted blocks, and agentpark
      then parked and restored those bytes): the same math in another split may round
      differently;
    - other turns: later turns agentpark restored nothing into (served from vLLM's own
      cache, or recomputed).
    """
    ref = {(t.agent, t.turn): t for t in reference.turns}
    kinds = ("first turns", RESTORED, RESTORED_AFTER_RECOMPUTE, "other turns")
    counts = {kind: [0, 0, 0] for kind in kinds}
    same_so_far: dict[int, bool] = {}
    for turn in sorted(run.turns, key=lambda t: (t.agent, t.turn)):
        other = ref.get((turn.agent, turn.turn))
        if other is None or turn.error or other.error:
            same_so_far[turn.agent] = False
            continue
        same = same_so_far.get(turn.agent, True) and _computed(turn) == _computed(other)
        same_so_far[turn.agent] = same
        if turn.turn == 0:
            kind = "first turns"
        elif turn.restored_bytes:
            kind = RESTORED if same else RESTORED_AFTER_RECOMPUTE
        else:
            kind = "other turns"
        count = counts[kind]
        count[0] += turn.tokens != other.tokens
        count[1] += turn.logprobs != other.logprobs
        count[2] += 1
    return {kind: (t, lp, n) for kind, (t, lp, n) in counts.items()}


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _print(results: list[RunResult], spec: VllmBenchSpec, blocks: int) -> None:
    from rich.table import Table

    from agentpark.bench.common import stdout_console

    by_name = {r.name: r for r in results}
    reference = by_name.get("reference")
    table = Table(
        title=f"agentpark bench vllm: {spec.agents} agents x {spec.turns} turns, "
        f"seed {spec.seed}, small KV {blocks} blocks of {BLOCK_SIZE}"
    )
    for column in (
        "run",
        "prefill computed",
        "TTFT after tool p50 / p99 (s)",
        "makespan (s)",
        "parked / restored",
        "turns differing (tokens / logprobs)",
        "errors",
    ):
        table.add_column(column, justify="right" if column != "run" else "left")
    for run in results:
        ttfts = run.ttfts()
        counters = run.host.get("counters", {})
        moved = (
            (
                f"{counters.get('bytes_parked', 0) / 2**20:.0f} / "
                f"{counters.get('bytes_restored', 0) / 2**20:.0f} MiB"
            )
            if run.host
            else "-"
        )
        if reference is None or run is reference:
            differs = "(reference)" if run is reference else "-"
        else:
            differs = "{} / {}".format(*_differs(run, reference))
        table.add_row(
            run.name,
            f"{run.prefill_computed:,}",
            f"{statistics.median(ttfts):.3f} / {_quantile(ttfts, 0.99):.3f}" if ttfts else "-",
            f"{run.makespan_s:.1f}",
            moved,
            differs,
            str(len(run.errors())),
        )
    out = stdout_console()
    out.print(table)
    plain, parked = by_name.get("plain"), by_name.get("agentpark")
    if plain and parked and parked.prefill_computed and parked.ttfts() and plain.ttfts():
        prefill = plain.prefill_computed / parked.prefill_computed
        ttft = statistics.median(plain.ttfts()) / statistics.median(parked.ttfts())
        out.print(
            f"agentpark vs plain: {prefill:.2f}x fewer prefill tokens (target >= 2), "
            f"{ttft:.2f}x lower p50 TTFT after a tool (target >= 1.5)"
        )
    if reference is not None:
        for run in results:
            if run is reference:
                continue
            parts = "; ".join(
                f"{kind} {n}: tokens {t}, logprobs {lp}"
                for kind, (t, lp, n) in breakdown(run, reference).items()
                if n
            )
            out.print(f"{run.name}, turns differing from the reference: {parts}")
    for run in results:
        if run.decisions:
            told = ", ".join(f"{label} {n}" for label, n in sorted(run.decisions.items()))
            out.print(f"{run.name}, turn ends: {told}")
    for run in results:
        for turn in run.errors()[:3]:
            out.print(f"{run.name}: agent {turn.agent} turn {turn.turn} failed: {turn.error}")


def run_vllm_bench(
    spec: VllmBenchSpec, runs: Sequence[str] = RUNS, model: Path | None = None
) -> int:
    """Run the bench and print its table; 1 if a request failed or agentpark's tokens differ."""
    unknown = [r for r in runs if r not in RUNS]
    if unknown or not runs:
        print(f"agentpark bench vllm: unknown runs {unknown}; choose from {RUNS}", file=sys.stderr)
        return 2
    clock = _Clock()
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
        blocks = spec.blocks or math.ceil(1.5 * spec.max_model_len / BLOCK_SIZE)
        clock.say(f"workload: {spec.agents} agents, {spec.turns} turns, seed {spec.seed}")
        results = []
        for name in [r for r in RUNS if r in runs]:
            results.append(_run(name, Path(model), work, plans, spec, blocks, clock))
            clock.say(f"{name}: done in {results[-1].makespan_s:.1f} s")
    _print(results, spec, blocks)
    return 1 if failed(results, spec) else 0


def failed(results: Sequence[RunResult], spec: VllmBenchSpec) -> bool:
    """Whether the bench fails: a request failed, or (one request at a time, ``exact``) a
    turn agentpark restored blocks into differs from the reference in a token or logprob.

    Batched, the servers batch the same requests differently, and that alone moves
    logprobs and now and then a greedy token, first turns included (measured): those
    differences are printed and counted, and only the exact mode can judge them.
    """
    if any(r.errors() for r in results):
        return True
    reference = next((r for r in results if r.name == "reference"), None)
    parked = next((r for r in results if r.name == "agentpark"), None)
    if reference is None or parked is None or not spec.exact:
        return False
    tokens, logprobs, _n = breakdown(parked, reference)[RESTORED]
    return bool(tokens or logprobs)
