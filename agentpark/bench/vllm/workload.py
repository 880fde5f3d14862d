"""The seeded workload of ``agentpark bench vllm``: each agent's prompts, tools, pauses and
results, from standard-library text (the same requests in every run)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentpark.bench.vllm.spec import TOOLS, VllmBenchSpec

__all__ = ["AgentPlan", "Step", "make_plans"]


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
