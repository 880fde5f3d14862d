"""Conversations that share (or do not share) a long system prompt, for the real-vLLM tests.

``system_prompt`` makes a prompt of about N tokens of the tiny model's own tokenizer (no
hub); ``play`` runs several conversations interleaved (each one's turn, then each one's
next) through the OpenAI SDK, greedy with logprobs, and keeps per turn what vLLM reports
it did not compute (``cached_tokens``: its own prefix-cache hits plus the connector's
loads) and what agentpark says it restored. ``nothing_recomputed_and_exact`` is the check
the shared-prefix tests make: tokens and logprobs equal a reference's, and every later
turn reused every whole block of the previous prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

__all__ = [
    "BLOCK",
    "Answer",
    "nothing_recomputed_and_exact",
    "opening",
    "play",
    "system_prompt",
]

BLOCK = 128  # vLLM's CPU block size
LINES = (
    "you are a coding agent working in a large python repository.",
    "tools: read_file(path), run_tests(pattern), apply_patch(diff), search(query).",
    "always read a file before editing it and run the tests after every change.",
    "answer with one tool call at a time; keep every explanation short.",
    "never touch files outside the repository and never push to any remote.",
)

Extra = Callable[[str], Mapping[str, Any]]


@dataclass
class Answer:
    tokens: list[str]
    logprobs: list[float]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # not computed by vLLM: its prefix-cache hits and agentpark's loads
    restored_tokens: int  # agentpark's loads, as the response's kv_transfer_params say


def system_prompt(model: Path, tokens: int, head: str = "") -> str:
    """``head`` then rules, about ``tokens`` tokens of the model's own tokenizer in all."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    lines = [head] if head else []
    while len(tokenizer.encode("\n".join(lines))) < tokens:
        lines.append(f"rule {len(lines)}: {LINES[len(lines) % len(LINES)]}")
    return "\n".join(lines)


def opening(system: str, name: str) -> list[dict[str, Any]]:
    """A conversation's first messages: the system prompt, then its own user ask."""
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"I am {name}: find the failing test and fix it"},
    ]


def no_extra(name: str) -> Mapping[str, Any]:
    return {}


def play(
    base_url: str,
    conversations: Mapping[str, list[dict[str, Any]]],
    turns: int,
    tool_result: str,
    extra: Extra = no_extra,
) -> dict[str, list[Answer]]:
    """``turns`` turns of every conversation, interleaved; ``extra(name)``: the request
    body's additions (kv_transfer_params, cache_salt, ...); each turn ends with a tool call
    the client answers with ``tool_result``."""
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    messages = {name: list(opening) for name, opening in conversations.items()}
    answers: dict[str, list[Answer]] = {name: [] for name in conversations}
    for _ in range(turns):
        for name, history in messages.items():
            response = client.chat.completions.create(
                model=model,
                messages=history,  # type: ignore[arg-type]
                max_tokens=16,
                temperature=0,
                logprobs=True,
                extra_body=dict(extra(name)),
            )
            choice = response.choices[0]
            assert choice.logprobs is not None and choice.logprobs.content is not None
            usage = response.usage
            assert usage is not None and usage.prompt_tokens_details is not None
            kv = (response.model_extra or {}).get("kv_transfer_params") or {}
            answers[name].append(
                Answer(
                    [t.token for t in choice.logprobs.content],
                    [t.logprob for t in choice.logprobs.content],
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    usage.prompt_tokens_details.cached_tokens or 0,
                    int((kv.get("agentpark") or {}).get("restored_tokens") or 0),
                )
            )
            n = len(history)
            call = {"name": "read_file", "arguments": json.dumps({"n": n})}
            history += [
                {
                    "role": "assistant",
                    "content": choice.message.content or "",
                    "tool_calls": [{"id": f"call-{n}", "type": "function", "function": call}],
                },
                {"role": "tool", "tool_call_id": f"call-{n}", "content": tool_result},
            ]
    return answers


def nothing_recomputed_and_exact(
    ours: Mapping[str, list[Answer]], reference: Mapping[str, list[Answer]]
) -> None:
    """Tokens and logprobs as the reference's; every later turn reused (vLLM's cache or
    agentpark's loads) every whole block of the previous prompt."""
    for name, answers in ours.items():
        for i, (turn, ref) in enumerate(zip(answers, reference[name], strict=True)):
            assert turn.tokens == ref.tokens, f"{name} turn {i + 1}: tokens differ"
            assert turn.logprobs == ref.logprobs, f"{name} turn {i + 1}: logprobs differ"
            if i:
                held = answers[i - 1].prompt_tokens // BLOCK * BLOCK
                assert turn.cached_tokens >= held, (
                    f"{name} turn {i + 1}: {turn.cached_tokens} tokens reused of the "
                    f"{held} the previous turn had in whole blocks"
                )
