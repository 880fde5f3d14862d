"""``agentpark bench agents``: many agents, one pool, four ways to treat an agent's KV.

A synthetic agentic workload drives a real daemon (uvicorn on 127.0.0.1, started by the bench,
with a temporary state directory and a temporary /dev/shm directory for the shm tier) over
real HTTP, one thread per agent. The same seeded workload runs under four policies, each on a
fresh daemon with the same model and the same pool, so the rows differ only in what happens
to an agent's KV while its tool runs.

**Workload.** N agents start together. Agent *i* sends a prompt (a system prompt and a task:
``prompt_tokens`` random tokens), then runs ``turns`` turns: a turn sends its input (the
prompt, or the previous tool's result: ``result_tokens`` tokens) and generates
``new_tokens`` tokens; between two turns the agent calls a tool and waits for it. The tool
is drawn per call (weights below) and its duration from the tool's log-normal distribution
(median, sigma, capped at ``cap`` x median), all multiplied by ``time_scale`` so a run takes
minutes: at the default 0.1 a web search of a median 8 s takes 0.8 s. Contexts grow to
several hundred to ~1k tokens; the reference model is big enough that a prefill of that is
hundreds of milliseconds on a CPU. The pool is sized so the agents' whole KV (each at its
final length) is ``pool_ratio`` times the pool.

**Policies.**

* ``keep-all``: no parking (the daemon has no tier, so nothing can be parked, not even by
  pressure relief) and no pause calls. Sessions only grow and hold their KV until the agent
  is done, so an agent is admitted when the pool has room for its whole context: FIFO, a
  block reservation in the bench, as an engine without preemption must do (admitting on
  current size deadlocks once every holder needs one more block). Waiting for admission
  counts in the makespan; a generate that still finds no room retries on 507 with a backoff.
* ``always-recompute``: drop the KV at every tool call and prefill it again when the tool
  returns: ``DELETE`` the session, then create a new one and generate with the whole token
  history (prompt, every generated token, every tool result) as ``prompt_tokens``. That is
  exactly "drop the KV, re-prefill", done by the real daemon's prefill path and measured end
  to end. No tiers either; a generate that finds no room waits on 507, and an agent whose
  follow-up call finds no room drops its KV and re-prefills later (recompute preemption).
* ``always-park``: ``pause`` with ``force: true`` at every tool call, the policy loop off (no
  idle, pressure-watermark or prefetch actions); the next generate restores the session.
* ``adaptive``: agentpark's policy, with its defaults (idle timeout, min_pause_s, watermark,
  prefetch lead, demotion, tick) scaled by ``time_scale`` like the workload, and per-tool
  priors set to each tool's median, as an operator who knows the tools would. ``pause``
  names the tool and, for the tools an orchestrator can estimate (``hinted``: its own
  services, web search and code run), gives ``expected_resume_s`` = the tool's median, so
  prefetch can restore the session before it returns; a human approval and a file read get
  no estimate, so the daemon's learned pauses (priors until it has seen some) decide. Short
  pauses are kept by break-even; a generate that finds no room parks idle sessions least
  recently used first.

**Metrics.** *Makespan*: from the start until the last agent has finished (its session
deleted). *Turns/s*: agents x turns / makespan. *TTFT* (time to first token after a tool
returns): the API does not stream, so each turn after a tool is two calls, ``generate(tool
result, max_new_tokens=1)`` then ``generate(max_new_tokens=new_tokens-1)``; TTFT is the time
from the tool's return (its drawn duration after the call started, even if a slow pause
call outlasted it) until the first call answered: waiting for room (507 retries), the
restore or re-prefill, the prefill of the result and one decode step. *Peak agents in
pool*: the most sessions holding KV in the pool at once, rebuilt from the daemon's events
(a session holds KV from the start of its first generate or restore to its pause or
delete). *HBM reclaimed*: byte-seconds of parked KV (each parked interval's bytes times its
length, from the events); KV that always-recompute drops is not "parked" and counts 0.
``/v1/host`` is sampled every 50 ms for the peak pool use and the plot's parked-KV panel.

**Checks.** The bench exits 1 when an agent did not complete all its turns, a generate
returned fewer tokens than asked, a session did not end with its whole context, or an
agent's tokens under always-park or adaptive differ from keep-all's (a restore is bit-exact,
so greedy decoding must give the same tokens). Re-prefill computes the log in different
chunks, so always-recompute's tokens are reported, not required, to match. Targets are
printed as met or not; they do not change the exit status.
"""

from __future__ import annotations

import contextlib
import math
import random
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.markup import escape

from agentpark.bench.common import progress_bar, stdout_console
from agentpark.bench.daemon import ThreadDaemon
from agentpark.config import ModelSettings, PolicySettings, Settings
from agentpark.engine.reference import PREFILL_BUCKETS, ModelSpec, PoolSpec, ReferenceEngine

__all__ = [
    "BENCH_MODEL",
    "DEFAULT_TOOLS",
    "POLICIES",
    "AgentPlan",
    "PolicyResult",
    "ToolSpec",
    "WorkloadSpec",
    "adaptive_policy",
    "make_workload",
    "parked_byte_seconds",
    "pool_timeline",
    "run_agents_bench",
    "undone_pressure_parks",
]

KEEP_ALL = "keep-all"
RECOMPUTE = "always-recompute"
ALWAYS_PARK = "always-park"
ADAPTIVE = "adaptive"
POLICIES = (KEEP_ALL, RECOMPUTE, ALWAYS_PARK, ADAPTIVE)
PARKING_POLICIES = (ALWAYS_PARK, ADAPTIVE)  # must give exactly keep-all's tokens

SHM_ROOT = Path("/dev/shm")

# Targets (DESIGN.md section 10, issue 4): adaptive's makespan against the others'.
TARGET_VS_KEEP_ALL = 1.5  # at least this much faster
TARGET_VS_RECOMPUTE = 1.2  # at least this much faster
TARGET_VS_PARK_SLOWER = 0.05  # at most this much slower

BACKOFF_START_S = 0.004
BACKOFF_MAX_S = 0.064
BUSY_BACKOFF_S = 0.002
EVENTS_LIMIT = 10_000  # the API's most per call

BENCH_MODEL = ModelSettings(
    d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=32, ffn_dim=1024, max_seq_len=1024
)
"""The reference model of the bench: KV of 2 KiB per token; on this 2-core CPU a 256-token
prefill chunk takes ~0.1 s and a decode step ~3 ms. ``max_seq_len`` is replaced by the
workload's longest context (rounded up), since every step attends over ``max_seq_len`` keys."""


@dataclass(frozen=True)
class ToolSpec:
    """A tool: its real-world duration distribution (seconds, before ``time_scale``)."""

    name: str
    median_s: float
    sigma: float  # log-normal shape: the log of the duration has this standard deviation
    weight: float  # how often an agent picks it
    cap: float = 4.0  # draws are capped at cap x median (a run has to end)
    hinted: bool = False  # adaptive: the orchestrator passes expected_resume_s (the median)


DEFAULT_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("read_file", median_s=0.5, sigma=0.5, weight=0.30),
    ToolSpec("web_search", median_s=8.0, sigma=0.5, weight=0.35, hinted=True),
    ToolSpec("code_run", median_s=12.0, sigma=0.8, weight=0.25, hinted=True),
    ToolSpec("human_approval", median_s=30.0, sigma=1.0, weight=0.10),
)


@dataclass(frozen=True)
class WorkloadSpec:
    agents: int = 24
    turns: int = 8
    seed: int = 0
    time_scale: float = 0.1
    prompt_tokens: tuple[int, int] = (320, 640)  # first input, uniform in [low, high]
    result_tokens: tuple[int, int] = (16, 48)  # each tool's result, uniform in [low, high]
    new_tokens: int = 8  # generated per turn (>= 2: one for TTFT, the rest after)
    pool_ratio: float = 3.0  # the agents' KV at their final length over the pool
    tools: tuple[ToolSpec, ...] = DEFAULT_TOOLS

    def problem(self) -> str | None:
        """Why this workload cannot run, or None."""
        if self.agents < 1 or self.turns < 1:
            return f"--agents and --turns must be >= 1, got {self.agents} and {self.turns}"
        if self.new_tokens < 2:
            return f"new_tokens must be >= 2 (TTFT is the first), got {self.new_tokens}"
        if not self.time_scale > 0:
            return f"--time-scale must be > 0, got {self.time_scale}"
        if not self.pool_ratio >= 1:
            return f"--pool-ratio must be >= 1, got {self.pool_ratio}"
        for low, high in (self.prompt_tokens, self.result_tokens):
            if not 1 <= low <= high:
                return f"token ranges need 1 <= low <= high, got {low}..{high}"
        if not self.tools or any(t.weight < 0 or t.median_s < 0 for t in self.tools):
            return "tools need non-negative weights and medians"
        return None


@dataclass(frozen=True)
class ToolCall:
    tool: ToolSpec
    duration_s: float  # after time_scale
    result: tuple[int, ...]
    hint_s: float | None = None  # adaptive's expected_resume_s: the scaled median, if hinted


@dataclass(frozen=True)
class AgentPlan:
    """One agent's whole run, drawn before any policy runs (the same for all of them)."""

    index: int
    prompt: tuple[int, ...]
    calls: tuple[ToolCall, ...]  # turns - 1: one between two turns
    new_tokens: int

    @property
    def turns(self) -> int:
        return len(self.calls) + 1

    @property
    def final_tokens(self) -> int:
        inputs = len(self.prompt) + sum(len(c.result) for c in self.calls)
        return inputs + self.turns * self.new_tokens

    @property
    def tool_time_s(self) -> float:
        return sum(c.duration_s for c in self.calls)


def make_workload(spec: WorkloadSpec) -> list[AgentPlan]:
    """The seeded plans of every agent."""
    # Separate streams, so the tool draws do not change when only the token counts do.
    tool_rng, token_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(spec.seed).spawn(2)
    )
    weights = np.array([t.weight for t in spec.tools], dtype=float)
    weights = weights / weights.sum()
    plans = []
    for index in range(spec.agents):
        prompt = _tokens(token_rng, spec.prompt_tokens)
        calls = []
        for _ in range(spec.turns - 1):
            tool = spec.tools[int(tool_rng.choice(len(spec.tools), p=weights))]
            draw = float(tool_rng.lognormal(math.log(max(tool.median_s, 1e-9)), tool.sigma))
            duration = min(draw, tool.cap * tool.median_s) * spec.time_scale
            hint = tool.median_s * spec.time_scale if tool.hinted else None
            calls.append(ToolCall(tool, duration, _tokens(token_rng, spec.result_tokens), hint))
        plans.append(AgentPlan(index, prompt, tuple(calls), spec.new_tokens))
    return plans


def _tokens(rng: np.random.Generator, bounds: tuple[int, int]) -> tuple[int, ...]:
    n = int(rng.integers(bounds[0], bounds[1] + 1))
    return tuple(int(t) for t in rng.integers(0, 256, size=n))


def adaptive_policy(spec: WorkloadSpec) -> PolicySettings:
    """agentpark's default policy with every duration scaled like the workload's."""
    base = PolicySettings()
    s = spec.time_scale
    return PolicySettings(
        enabled=True,
        tick_s=max(0.01, base.tick_s * s),
        idle_pause_after_s=base.idle_pause_after_s * s,
        min_pause_s=base.min_pause_s * s,
        overhead_s=base.overhead_s,  # a real cost of this host, not a workload time
        demote_after_s={tier: after * s for tier, after in base.demote_after_s.items()},
        hbm_high_watermark=base.hbm_high_watermark,
        prefetch_lead_s=base.prefetch_lead_s * s,
        tool_quantile=base.tool_quantile,
        tool_window=base.tool_window,
        tools={t.name: {"expected_pause_s": t.median_s * s} for t in spec.tools},
    )


# ---- results ---------------------------------------------------------------------------------


@dataclass
class AgentResult:
    index: int
    turns_done: int = 0
    outputs: list[list[int]] = field(default_factory=list)  # generated tokens per turn
    short: list[str] = field(default_factory=list)  # generates that returned too few tokens
    ttft_s: list[float] = field(default_factory=list)
    num_tokens: int = 0  # the session's length after its last generate
    finished_at: float | None = None  # perf_counter
    admission_wait_s: float = 0.0
    full_waits: int = 0  # 507 pool_full answers
    full_wait_s: float = 0.0
    busy_retries: int = 0
    parked: int = 0  # pause answers: decision parked
    kept: int = 0  # pause answers: decision kept
    pause_refused: int = 0  # pause answered 507 tier_full
    restored: dict[str, int] = field(default_factory=dict)  # generate's restored_from
    recreated: int = 0  # always-recompute: sessions created again with the whole history
    preempted: int = 0  # always-recompute: follow-up found no room, KV dropped
    session_ids: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class PolicyResult:
    policy: str
    agents: list[AgentResult]
    plans: list[AgentPlan]
    makespan_s: float = math.nan
    t0: float = 0.0  # wall clock (time.time) of the start
    events: list[dict[str, Any]] = field(default_factory=list)
    samples: list[tuple[float, int, int, int]] = field(default_factory=list)
    timeline: list[tuple[float, int]] = field(default_factory=list)
    reclaimed_byte_s: float = 0.0
    error: str | None = None  # the run itself failed (the daemon did not start, ...)

    @property
    def turns(self) -> int:
        return sum(a.turns_done for a in self.agents)

    @property
    def ttfts(self) -> list[float]:
        return [t for a in self.agents for t in a.ttft_s]

    @property
    def peak_in_pool(self) -> int:
        return max((n for _, n in self.timeline), default=0)

    @property
    def mean_in_pool(self) -> float:
        return time_average(self.timeline, 0.0, self.makespan_s)

    @property
    def peak_pool_use(self) -> float:
        return max((used / total for _, used, total, _ in self.samples if total), default=0.0)

    def event_count(self, kind: str, reasons: Iterable[str] | None = None) -> int:
        wanted = None if reasons is None else set(reasons)
        return sum(
            1
            for e in self.events
            if e["kind"] == kind and (wanted is None or e.get("reason") in wanted)
        )

    def problems(self) -> list[str]:
        """Why this run does not count: agents that did not finish, short outputs."""
        if self.error is not None:
            return [self.error]
        out = []
        for agent, plan in zip(self.agents, self.plans, strict=True):
            who = f"agent {agent.index}"
            if agent.error is not None:
                out.append(f"{who}: {agent.error}")
            if agent.turns_done != plan.turns:
                out.append(f"{who} completed {agent.turns_done} of {plan.turns} turns")
            elif agent.num_tokens != plan.final_tokens:
                out.append(
                    f"{who} ended with {agent.num_tokens} tokens in its session, "
                    f"expected {plan.final_tokens}"
                )
            out.extend(f"{who}: {s}" for s in agent.short)
        return out


# ---- timelines from the daemon's events ------------------------------------------------------

_ENTERS = ("generate", "resume", "recompute", "adopt")
_LEAVES = ("pause", "delete", "lost", "corrupt")


def _start_of(event: dict[str, Any]) -> float:
    return float(event["at"]) - float(event.get("duration_ms") or 0.0) / 1e3


def pool_timeline(events: Sequence[dict[str, Any]], t0: float) -> list[tuple[float, int]]:
    """``(seconds since t0, sessions holding KV in the pool)`` after every change.

    ``events`` are the daemon's (``at`` in epoch seconds), in any order. A session holds KV
    from the start of its first generate or restore (``at`` minus the duration) until a
    pause, delete or loss.
    """
    changes: list[tuple[float, int]] = []
    in_pool: dict[str, bool] = {}
    for e in sorted(events, key=lambda e: (e["session_id"], e["id"])):
        sid, kind = e["session_id"], e["kind"]
        if kind in _ENTERS and not in_pool.get(sid, False):
            in_pool[sid] = True
            changes.append((_start_of(e) - t0, +1))
        elif kind in _LEAVES and in_pool.get(sid, False):
            in_pool[sid] = False
            changes.append((float(e["at"]) - t0, -1))
    timeline: list[tuple[float, int]] = [(0.0, 0)]
    count = 0
    for t, delta in sorted(changes):
        count += delta
        t = max(t, 0.0)
        if t == timeline[-1][0]:
            timeline[-1] = (t, count)
        else:
            timeline.append((t, count))
    return timeline


def parked_byte_seconds(events: Sequence[dict[str, Any]], end: float) -> float:
    """Bytes x seconds of parked KV: from each pause to the start of the restore (or delete).

    ``end`` (epoch seconds) closes an interval that never ended.
    """
    total = 0.0
    parked: dict[str, tuple[float, int]] = {}
    for e in sorted(events, key=lambda e: (e["session_id"], e["id"])):
        sid, kind = e["session_id"], e["kind"]
        if kind == "pause":
            parked[sid] = (float(e["at"]), int(e.get("bytes") or 0))
        elif sid in parked and kind in ("resume", "recompute", "delete", "lost", "corrupt"):
            since, nbytes = parked.pop(sid)
            stop = _start_of(e) if kind in ("resume", "recompute") else float(e["at"])
            total += nbytes * max(0.0, stop - since)
    for since, nbytes in parked.values():
        total += nbytes * max(0.0, end - since)
    return total


def undone_pressure_parks(events: Sequence[dict[str, Any]], within_s: float) -> int:
    """Pressure parks whose session was being restored less than ``within_s`` later.

    Pressure relief parks the least recently used idle session; one that was only idle
    between two calls of its agent comes straight back, and the round trip was wasted.
    """
    undone = 0
    parked_at: dict[str, float] = {}
    for e in sorted(events, key=lambda e: (e["session_id"], e["id"])):
        sid, kind = e["session_id"], e["kind"]
        if kind == "pause":
            if e.get("reason") == "pressure":
                parked_at[sid] = float(e["at"])
            else:
                parked_at.pop(sid, None)
        elif kind in ("resume", "delete") and sid in parked_at:
            since = parked_at.pop(sid)
            undone += kind == "resume" and _start_of(e) - since < within_s
    return undone


def time_average(timeline: Sequence[tuple[float, int]], start: float, end: float) -> float:
    """The time-weighted mean of a step function over [start, end]."""
    if not timeline or not end > start:
        return 0.0
    area = 0.0
    for (t, value), nxt in zip(timeline, [*timeline[1:], (end, 0)], strict=True):
        lo, hi = max(t, start), min(nxt[0], end)
        if hi > lo:
            area += value * (hi - lo)
    return area / (end - start)


# ---- the agents ------------------------------------------------------------------------------


class _Aborted(Exception):
    """The run was stopped (an agent failed, or the time limit passed)."""


class _PoolFull(Exception):
    """507 pool_full where the caller asked to handle it itself."""


class BlockBudget:
    """keep-all's admission: FIFO reservations of pool blocks."""

    def __init__(self, total: int) -> None:
        self.free = total
        self._cond = threading.Condition()
        self._queue: deque[object] = deque()

    def acquire(self, n: int, stop: threading.Event) -> float:
        """Reserve ``n`` blocks once every earlier caller has; seconds waited."""
        started = time.perf_counter()
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            try:
                while not (self._queue[0] is ticket and self.free >= n):
                    if stop.is_set():
                        raise _Aborted
                    self._cond.wait(0.05)
            except BaseException:
                self._queue.remove(ticket)
                self._cond.notify_all()
                raise
            self._queue.popleft()
            self.free -= n
            self._cond.notify_all()
        return time.perf_counter() - started

    def release(self, n: int) -> None:
        with self._cond:
            self.free += n
            self._cond.notify_all()


@dataclass
class _Shared:
    """What every agent of one policy run shares."""

    policy: str
    client: httpx.Client
    block_size: int
    go: threading.Event
    stop: threading.Event
    budget: BlockBudget | None
    on_turn: Callable[[], None]


class _Agent:
    def __init__(self, shared: _Shared, plan: AgentPlan, seed: int) -> None:
        self.s = shared
        self.plan = plan
        self.result = AgentResult(plan.index)
        self.history: list[int] = []  # every token of the conversation so far
        self.sid = ""
        self._generation = 0
        self._jitter = random.Random(seed * 1_000_003 + plan.index)  # not the workload's rng

    # -- the loop --------------------------------------------------------------------------

    def __call__(self) -> None:
        try:
            self._run()
        except _Aborted:
            self.result.error = self.result.error or "aborted (another agent failed, or timeout)"
        except Exception as exc:
            self.result.error = f"{type(exc).__name__}: {exc}"
            self.s.stop.set()
        finally:
            self.result.finished_at = time.perf_counter()

    def _run(self) -> None:
        plan, policy = self.plan, self.s.policy
        self.s.go.wait()
        reserved = 0
        if self.s.budget is not None:
            reserved = -(-plan.final_tokens // self.s.block_size)
            self.result.admission_wait_s = self.s.budget.acquire(reserved, self.s.stop)
        try:
            self._new_session()
            self._turn(plan.prompt, None)
            for call in plan.calls:
                started = time.perf_counter()
                self._tool_starts(call)
                returns_at = started + call.duration_s
                remaining = returns_at - time.perf_counter()
                if remaining > 0 and self.s.stop.wait(remaining):
                    raise _Aborted
                if policy == RECOMPUTE:
                    self._new_session()
                self._turn(call.result, returns_at)
            self._delete()
        finally:
            if self.s.budget is not None and reserved:
                self.s.budget.release(reserved)

    def _turn(self, tokens: Sequence[int], returned_at: float | None) -> None:
        """Send the input, generate new_tokens: the first alone (TTFT), then the rest."""
        res = self.result
        if self.s.policy == RECOMPUTE and returned_at is not None:
            first = self._generate([*self.history, *tokens], 1)  # the re-prefill
            res.recreated += 1
        else:
            first = self._generate(tokens, 1)
        if returned_at is not None:
            res.ttft_s.append(time.perf_counter() - returned_at)
        self.history.extend(tokens)
        self.history.extend(first["tokens"])
        rest = self._follow_up(self.plan.new_tokens - 1)
        self.history.extend(rest["tokens"])
        out = [*first["tokens"], *rest["tokens"]]
        if len(out) != self.plan.new_tokens:
            res.short.append(f"turn {res.turns_done} gave {len(out)} tokens")
        res.outputs.append(out)
        res.num_tokens = int(rest["num_tokens"])
        res.turns_done += 1
        self.s.on_turn()

    def _follow_up(self, n: int) -> dict[str, Any]:
        if self.s.policy != RECOMPUTE:
            return self._generate([], n)
        try:
            return self._generate([], n, on_full=_PoolFull)
        except _PoolFull:
            # Preempt by recompute: drop the KV, come back with the whole history.
            self.result.preempted += 1
            self._delete()
            self._new_session()
            return self._generate(self.history, n)

    def _tool_starts(self, call: ToolCall) -> None:
        policy = self.s.policy
        if policy == RECOMPUTE:
            self._delete()
        elif policy == ALWAYS_PARK:
            self._pause({"tool": call.tool.name, "force": True})
        elif policy == ADAPTIVE:
            body: dict[str, Any] = {"tool": call.tool.name}
            if call.hint_s is not None:
                body["expected_resume_s"] = call.hint_s
            self._pause(body)

    # -- HTTP ------------------------------------------------------------------------------

    def _new_session(self) -> None:
        self.sid = f"agent-{self.plan.index:04d}-{self._generation}"
        self._generation += 1
        self._call("POST", "/v1/sessions", {"session_id": self.sid}, ok=(201,))
        self.result.session_ids.append(self.sid)

    def _delete(self) -> None:
        self._call("DELETE", f"/v1/sessions/{self.sid}", None, ok=(204,))

    def _pause(self, body: dict[str, Any]) -> None:
        response = self._call(
            "POST", f"/v1/sessions/{self.sid}/pause", body, ok=(200,), tier_full_ok=True
        )
        if response.status_code == 507:
            self.result.pause_refused += 1
        elif response.json()["decision"] == "kept":
            self.result.kept += 1
        else:
            self.result.parked += 1

    def _generate(
        self, tokens: Sequence[int], n: int, on_full: type[Exception] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"max_new_tokens": n}
        if tokens:
            body["prompt_tokens"] = list(tokens)
        path = f"/v1/sessions/{self.sid}/generate"
        res = self.result
        delay = BACKOFF_START_S
        while True:
            response = self.s.client.post(path, json=body)
            if response.status_code == 200:
                out: dict[str, Any] = response.json()
                if out.get("restored_from"):
                    where = str(out["restored_from"])
                    res.restored[where] = res.restored.get(where, 0) + 1
                return out
            if _code(response) == "pool_full":
                if on_full is not None:
                    raise on_full
                res.full_waits += 1
                waited = delay * self._jitter.uniform(0.5, 1.5)
                res.full_wait_s += waited
                if self.s.stop.wait(waited):
                    raise _Aborted
                delay = min(delay * 2, BACKOFF_MAX_S)
            elif _code(response) == "session_busy":  # a policy action holds it briefly
                res.busy_retries += 1
                if self.s.stop.wait(BUSY_BACKOFF_S):
                    raise _Aborted
            else:
                raise RuntimeError(f"generate {self.sid}: {_describe(response)}")

    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        ok: tuple[int, ...],
        tier_full_ok: bool = False,
    ) -> httpx.Response:
        while True:
            response = self.s.client.request(method, path, json=body)
            if response.status_code in ok:
                return response
            if tier_full_ok and _code(response) == "tier_full":
                return response
            if _code(response) != "session_busy":
                raise RuntimeError(f"{method} {path}: {_describe(response)}")
            self.result.busy_retries += 1
            if self.s.stop.wait(BUSY_BACKOFF_S):
                raise _Aborted


def _code(response: httpx.Response) -> str | None:
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return str(code)


def _describe(response: httpx.Response) -> str:
    return f"HTTP {response.status_code}: {response.text[:300]}"


# ---- one policy on one daemon ----------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """What every policy's daemon shares: the model, the pool, the tier sizes, the dirs."""

    spec: WorkloadSpec
    plans: list[AgentPlan]
    model: ModelSettings
    block_size: int
    pool_blocks: int
    tier_bytes: int
    root: Path
    shm_root: Path
    timeout_s: float
    sample_s: float

    @property
    def token_bytes(self) -> int:
        m = self.model
        return m.n_layers * 2 * m.n_kv_heads * m.head_dim * 2  # bfloat16 K and V

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.token_bytes

    def final_blocks(self, plan: AgentPlan) -> int:
        return -(-plan.final_tokens // self.block_size)


def _setup(
    spec: WorkloadSpec,
    model: ModelSettings,
    block_size: int,
    root: Path,
    shm_root: Path,
    timeout_s: float,
    sample_s: float,
) -> Setup:
    plans = make_workload(spec)
    # Every step attends over max_seq_len keys: no longer than the workload needs.
    longest = max(p.final_tokens for p in plans)
    model = model.model_copy(update={"max_seq_len": max(64, -(-longest // 64) * 64)})
    final = [-(-p.final_tokens // block_size) for p in plans]
    pool_blocks = max(math.ceil(sum(final) / spec.pool_ratio), max(final) + 1)
    token_bytes = model.n_layers * 2 * model.n_kv_heads * model.head_dim * 2
    # Room in dram for every agent's whole KV, with a margin (and half that in shm).
    tier_bytes = (sum(final) * 5 // 4 + 8) * block_size * token_bytes
    return Setup(
        spec, plans, model, block_size, pool_blocks, tier_bytes, root, shm_root, timeout_s, sample_s
    )


def _settings(policy: str, setup: Setup) -> Settings:
    parks = policy in PARKING_POLICIES
    if policy == ADAPTIVE:
        policy_settings = adaptive_policy(setup.spec)
    else:  # no loop: no idle, watermark or prefetch actions
        policy_settings = PolicySettings(enabled=False, idle_pause_after_s=0)
    dram = setup.tier_bytes if parks else 0
    state_dir = setup.root / policy
    return Settings(
        state_dir=state_dir,
        log_level="warning",
        server={"host": "127.0.0.1", "port": 0},
        model=setup.model,
        pool={"block_size": setup.block_size, "num_blocks": setup.pool_blocks},
        tiers={
            "dram": {"capacity": dram},
            "shm": {"capacity": dram // 2, "path": setup.shm_root / f"{policy}.tier"},
            "disk": {"capacity": 0},
        },
        limits={"max_new_tokens": max(16, setup.spec.new_tokens)},
        shutdown={"drain": False, "deadline_s": 5.0},
        policy=policy_settings,
    )


def _run_policy(policy: str, setup: Setup, on_turn: Callable[[], None]) -> PolicyResult:
    """One policy on a fresh daemon: every agent in its own thread, /v1/host sampled."""
    result = PolicyResult(policy, [], setup.plans)
    go, stop, sampled = threading.Event(), threading.Event(), threading.Event()
    n = setup.spec.agents
    daemon = ThreadDaemon.start(_settings(policy, setup))
    try:
        with httpx.Client(
            base_url=daemon.url,
            timeout=300.0,
            limits=httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8),
        ) as client:
            budget = BlockBudget(setup.pool_blocks) if policy == KEEP_ALL else None
            shared = _Shared(policy, client, setup.block_size, go, stop, budget, on_turn)
            agents = [_Agent(shared, plan, setup.spec.seed) for plan in setup.plans]
            threads = [
                threading.Thread(target=agent, name=f"bench-agent-{i}", daemon=True)
                for i, agent in enumerate(agents)
            ]
            threads.append(
                threading.Thread(
                    target=_sample_host,
                    args=(client, setup.sample_s, sampled, stop, result.samples),
                    name="bench-sampler",
                    daemon=True,
                )
            )
            for thread in threads:
                thread.start()
            result.t0 = time.time()
            t0 = time.perf_counter()
            go.set()
            for thread in threads[:-1]:
                thread.join(max(0.0, t0 + setup.timeout_s - time.perf_counter()))
                if thread.is_alive() and not stop.is_set():
                    result.error = f"did not finish within {setup.timeout_s:g}s"
                    stop.set()
            sampled.set()
            for thread in threads:
                thread.join(60)
            result.agents = [agent.result for agent in agents]
            ends = [a.finished_at for a in result.agents if a.finished_at is not None]
            result.makespan_s = (max(ends) if ends else time.perf_counter()) - t0
            sessions = [sid for a in result.agents for sid in a.session_ids]
            result.events = _fetch_events(client, sessions)
    finally:
        stop.set()  # on any way out: no agent keeps calling a daemon that is going away
        go.set()
        daemon.stop()
    result.timeline = pool_timeline(result.events, result.t0)
    result.reclaimed_byte_s = parked_byte_seconds(result.events, result.t0 + result.makespan_s)
    return result


def _sample_host(
    client: httpx.Client,
    every_s: float,
    done: threading.Event,
    stop: threading.Event,
    samples: list[tuple[float, int, int, int]],
) -> None:
    """``(epoch seconds, used blocks, total blocks, reclaimed bytes)`` from /v1/host."""
    while not stop.is_set():
        try:
            host = client.get("/v1/host").json()
        except httpx.HTTPError:  # the run is being torn down
            return
        pool = host["pool"]
        samples.append(
            (time.time(), pool["used_blocks"], pool["total_blocks"], host["reclaimed_bytes"])
        )
        if done.wait(every_s):
            return


def _fetch_events(client: httpx.Client, session_ids: Sequence[str]) -> list[dict[str, Any]]:
    """Every event of the run, oldest first, ``at`` in epoch seconds."""
    raw = _events(client, {"limit": EVENTS_LIMIT})
    if len(raw) >= EVENTS_LIMIT:  # more than one page: per session (each well under it)
        by_id: dict[int, dict[str, Any]] = {}
        for sid in session_ids:
            for event in _events(client, {"limit": EVENTS_LIMIT, "session_id": sid}):
                by_id[int(event["id"])] = event
        raw = list(by_id.values())
    for event in raw:
        event["at"] = datetime.fromisoformat(str(event["at"])).timestamp()
    return sorted(raw, key=lambda e: int(e["id"]))


def _events(client: httpx.Client, params: dict[str, Any]) -> list[dict[str, Any]]:
    response = client.get("/v1/events", params=params)
    response.raise_for_status()
    events: list[dict[str, Any]] = response.json()["events"]
    return events


def _prewarm(setup: Setup) -> None:
    """Compile every step shape the runs use, once (the daemons share JAX's cache)."""
    spec = ModelSpec(**setup.model.model_dump())
    engine = ReferenceEngine(spec, PoolSpec(setup.block_size, setup.pool_blocks))
    engine.warmup()
    for bucket in PREFILL_BUCKETS:
        blocks = engine.blocks_for(bucket)
        if bucket > spec.max_seq_len or blocks > setup.pool_blocks:
            break
        table = engine.allocator.allocate(("bench", f"warm-{bucket}"), blocks)
        engine.extend(table, 0, [0] * bucket)
        engine.allocator.free(("bench", f"warm-{bucket}"), table)


# ---- the bench -------------------------------------------------------------------------------


def run_agents_bench(
    spec: WorkloadSpec | None = None,
    *,
    policies: Sequence[str] = POLICIES,
    model: ModelSettings | None = None,
    block_size: int = 16,
    plot: Path | None = None,
    console: Console | None = None,
    progress_console: Console | None = None,
    timeout_s: float = 1800.0,
    sample_s: float = 0.05,
) -> int:
    """Run every policy on the same workload and print the tables (stdout by default).

    Returns 0 when every run completed and checked out, 1 otherwise, 2 for arguments that
    cannot run. ``plot``: a PNG of sessions in the pool over time, when matplotlib is there.
    The progress bar goes to ``progress_console`` (stderr by default).
    """
    from agentpark.bench.agents_report import print_workload, report  # it imports this module

    spec = spec if spec is not None else WorkloadSpec()
    out = console if console is not None else stdout_console(170)
    err = progress_console if progress_console is not None else Console(stderr=True)
    problem = spec.problem()
    unknown = [p for p in policies if p not in POLICIES]
    if problem is None and (unknown or not policies or len(set(policies)) != len(policies)):
        problem = f"policies must be distinct names of {', '.join(POLICIES)}; got {policies}"
    if problem is not None:
        err.print(f"agentpark: {escape(problem)}", soft_wrap=True, highlight=False)
        return 2
    results: list[PolicyResult] = []
    with contextlib.ExitStack() as cleanup:
        root = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="agentpark-")))
        parent = SHM_ROOT if SHM_ROOT.is_dir() else root
        shm_root = Path(tempfile.mkdtemp(prefix="agentpark-bench-agents-", dir=parent))
        cleanup.callback(shutil.rmtree, shm_root, ignore_errors=True)
        setup = _setup(spec, model or BENCH_MODEL, block_size, root, shm_root, timeout_s, sample_s)
        print_workload(out, setup)
        with progress_bar(err) as progress:
            task = progress.add_task(
                "compiling the model", total=len(policies) * spec.agents * spec.turns
            )
            _prewarm(setup)
            for policy in policies:
                progress.update(task, description=f"agents bench: {policy}")
                try:
                    result = _run_policy(policy, setup, lambda: progress.advance(task))
                except Exception as exc:  # the daemon did not start, ...
                    result = PolicyResult(
                        policy, [], setup.plans, error=f"{type(exc).__name__}: {exc}"
                    )
                results.append(result)
    return report(out, setup, results, plot)
