"""The seeded workloads of ``agentpark bench vllm``: each agent's (or conversation's)
prompts, tools, pauses and results, from standard-library text (the same requests in every
run). ``agents``: each agent its own system prompt; ``shared-prefix``: one system prompt for
all; ``multi-turn``: agentpark.bench.vllm.conversations."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentpark.bench.vllm.conversations import make_conversations
from agentpark.bench.vllm.plan import MESSAGE_OVERHEAD, AgentPlan, Step, prompt_tokens, text_of
from agentpark.bench.vllm.spec import VllmBenchSpec

__all__ = ["MESSAGE_OVERHEAD", "AgentPlan", "Step", "make_plans", "prompt_tokens", "text_of"]


def _tool_steps(
    spec: VllmBenchSpec, tokenizer: Any, rng: random.Random, files: Sequence[Path], agent: int
) -> list[Step]:
    names = sorted(spec.tools)
    steps = []
    for turn in range(spec.turns - 1):
        tool = names[rng.randrange(len(names))]
        median, sigma = spec.tools[tool]
        pause = min(median * math.exp(rng.gauss(0.0, sigma)), 4 * median)
        steps.append(
            Step(
                tool=tool,
                median_s=median * spec.time_scale,
                pause_s=pause * spec.time_scale,
                call_id=f"call_{agent}_{turn}",
                arguments=json.dumps({"query": f"step {turn} of agent {agent}"}),
                result=text_of(tokenizer, rng, files, rng.randint(*spec.result)),
            )
        )
    return steps


def make_plans(spec: VllmBenchSpec, tokenizer: Any) -> list[AgentPlan]:
    """Every agent's prompts, tools, pauses and results: a function of the spec only."""
    from agentpark.vllm_tools.model import corpus_files

    files = corpus_files()
    if spec.workload == "multi-turn":
        return make_conversations(spec, tokenizer, files)
    rng = random.Random(spec.seed)
    names = ", ".join(sorted(spec.tools))
    shared = ""
    if spec.workload == "shared-prefix":  # drawn once: every agent sends these very tokens
        shared = f"You edit Python code with tools: {names}.\n"
        header = len(tokenizer.encode(shared, add_special_tokens=False))
        shared += text_of(tokenizer, rng, files, spec.system_tokens - header)
    plans = []
    for agent in range(spec.agents):
        if shared:
            system = shared
            task = "\n" + text_of(tokenizer, rng, files, rng.randint(*spec.task))
        else:
            system = f"Agent {agent}. You edit Python code with tools: {names}.\n"
            system += text_of(tokenizer, rng, files, rng.randint(*spec.context) - 60)
            task = ""
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Task {agent}: make the tests pass." + task},
        ]
        steps = _tool_steps(spec, tokenizer, rng, files, agent)
        plans.append(AgentPlan(f"bench-agent-{agent}", messages, steps))
    return plans
