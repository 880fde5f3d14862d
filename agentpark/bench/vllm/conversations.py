"""The ``multi-turn`` workload of ``agentpark bench vllm``: conversations shaped like vLLM's
own KV-offloading benchmark (benchmarks/multi_turn, generate_multi_turn.json), from seeded
standard-library text.

Every conversation's first user message is a common prefix (the same tokens in all), the
conversation's number, a per-conversation prefix (log-normal around its average, as vLLM
draws it, capped at twice that), then a request and ``user_tokens`` of text; each later
turn is the assistant's answer of ``answer_tokens`` (replayed by the client, as vLLM's
benchmark replays the dataset's when it is given one) and a user turn of ``user_tokens``.
No system prompt, no tools, no session name: the client sends only the messages."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentpark.bench.vllm.plan import AgentPlan, Step, text_of
from agentpark.bench.vllm.spec import VllmBenchSpec

__all__ = ["REQUEST", "conversation_prefix", "make_conversations"]

REQUEST = "Please rewrite the following text and add more content: "
MEDIAN_RATIO = 0.85  # vLLM's default median / average of its log-normal


def conversation_prefix(rng: random.Random, average: int) -> int:
    """A per-conversation prefix length: log-normal with ``average`` as its mean (vLLM's
    parameters: median = 0.85 x average), at least 1 token, at most twice the average."""
    sigma = math.sqrt(2 * math.log(1 / MEDIAN_RATIO))
    drawn = rng.lognormvariate(math.log(MEDIAN_RATIO * average), sigma)
    return max(1, min(2 * average, round(drawn)))


def _user_turn(
    tokenizer: Any, rng: random.Random, files: Sequence[Path], tokens: int, request: int
) -> str:
    """A user turn of ``tokens`` tokens: the request, then text."""
    return REQUEST + text_of(tokenizer, rng, files, max(0, tokens - request))


def make_conversations(
    spec: VllmBenchSpec, tokenizer: Any, files: Sequence[Path]
) -> list[AgentPlan]:
    """``spec.agents`` conversations of ``spec.turns`` user turns: a function of the spec."""
    rng = random.Random(spec.seed)
    request = len(tokenizer.encode(REQUEST, add_special_tokens=False))
    common = ""
    if spec.common_prefix_tokens > 0:
        common = text_of(tokenizer, rng, files, spec.common_prefix_tokens - 1) + "."
    plans = []
    for conversation in range(spec.agents):
        prefix = conversation_prefix(rng, spec.conversation_prefix_tokens)
        first = f"{common}{conversation} is a nice number... {conversation}, "
        first += text_of(tokenizer, rng, files, prefix)
        first += _user_turn(tokenizer, rng, files, rng.randint(*spec.user_tokens), request)
        steps = [
            Step(
                tool=None,
                median_s=0.0,
                pause_s=0.0,
                call_id="",
                arguments="",
                answer=text_of(tokenizer, rng, files, rng.randint(*spec.answer_tokens)),
                result=_user_turn(tokenizer, rng, files, rng.randint(*spec.user_tokens), request),
            )
            for _turn in range(spec.turns - 1)
        ]
        plans.append(
            AgentPlan(
                f"bench-conversation-{conversation}", [{"role": "user", "content": first}], steps
            )
        )
    return plans
