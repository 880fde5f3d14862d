"""The seeded workload of ``agentpark bench agents``: the policies' names, the tools and
their duration distributions, and every agent's plan (prompt, tool calls, results), drawn
once before any policy runs."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ADAPTIVE",
    "ALWAYS_PARK",
    "DEFAULT_TOOLS",
    "KEEP_ALL",
    "PARKING_POLICIES",
    "POLICIES",
    "RECOMPUTE",
    "AgentPlan",
    "ToolCall",
    "ToolSpec",
    "WorkloadSpec",
    "make_workload",
]

KEEP_ALL = "keep-all"
RECOMPUTE = "always-recompute"
ALWAYS_PARK = "always-park"
ADAPTIVE = "adaptive"
POLICIES = (KEEP_ALL, RECOMPUTE, ALWAYS_PARK, ADAPTIVE)
PARKING_POLICIES = (ALWAYS_PARK, ADAPTIVE)  # must give exactly keep-all's tokens


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
