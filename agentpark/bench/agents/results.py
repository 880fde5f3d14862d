"""What one agent and one policy's run of ``agentpark bench agents`` measured, and why a
run does not count (an agent that did not finish, a short output)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agentpark.bench.agents.timeline import time_average
from agentpark.bench.agents.workload import AgentPlan

__all__ = ["AgentResult", "PolicyResult"]


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
