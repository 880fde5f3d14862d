"""What a workload of ``agentpark bench vllm`` is made of: an agent's (or conversation's)
plan, the step after each turn and the messages it appends, seeded text, and a prompt's
size (agentpark.bench.vllm.workload makes the plans)."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MESSAGE_OVERHEAD", "AgentPlan", "Step", "prompt_tokens", "text_of"]

# Tokens a chat template adds per message (role markers), counted when a prompt is sized.
MESSAGE_OVERHEAD = 8


@dataclass
class Step:
    """What follows a turn: the tool the agent runs (how long it takes, what it returns),
    or, in a conversation (``tool`` None), the assistant's answer and the user's next turn.
    The model's own answer is never fed back: every run sends the very same prompts."""

    tool: str | None
    median_s: float
    pause_s: float
    call_id: str
    arguments: str
    result: str  # the tool's result, or the user's next turn
    answer: str = ""  # a conversation's assistant answer as the client replays it

    def assistant(self) -> dict[str, Any]:
        """The assistant message the client appends after the turn."""
        if self.tool is None:
            return {"role": "assistant", "content": self.answer}
        call = {"name": self.tool, "arguments": self.arguments}
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": self.call_id, "type": "function", "function": call}],
        }

    def follow(self) -> dict[str, Any]:
        """The message that starts the next turn: the tool's result or the user's turn."""
        if self.tool is None:
            return {"role": "user", "content": self.result}
        return {"role": "tool", "tool_call_id": self.call_id, "content": self.result}


@dataclass
class AgentPlan:
    session_id: str
    messages: list[dict[str, Any]]  # the first prompt
    steps: list[Step]  # one per turn but the last


def text_of(tokenizer: Any, rng: random.Random, files: Sequence[Path], tokens: int) -> str:
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


def prompt_tokens(plan: AgentPlan, tokenizer: Any) -> int:
    """About how many tokens the plan's last prompt takes (its contents, the tool calls'
    arguments, and each message's template overhead): sized against --max-model-len."""
    messages = [*plan.messages]
    for step in plan.steps:
        messages += [step.assistant(), step.follow()]
    total = 0
    for message in messages:
        parts = [str(message.get("content") or "")]
        parts += [json.dumps(call["function"]) for call in message.get("tool_calls", [])]
        total += MESSAGE_OVERHEAD
        total += sum(len(tokenizer.encode(p, add_special_tokens=False)) for p in parts if p)
    return total
