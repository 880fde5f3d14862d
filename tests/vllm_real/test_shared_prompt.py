"""Sessions that share one long system prompt, under a small KV cache (issue 19).

Reported: three sessions sharing a ~700-token system prompt on 24 blocks of KV cache
(max-model-len 2048) never restored, while three with a prompt each did. Measured here
(block size 128): the prompt fills 5 blocks, and vLLM's prefix cache holds them once for
all three sessions. After three turns the three need 5 + 3 x 2 whole blocks, far under 24,
so vLLM evicts nothing and every later turn is its own prefix-cache hit of every whole
block the session had: there is nothing to restore, and agentpark rightly loads nothing
(with a prompt each they need 3 x 7 = 21, and the next turn's allocation evicts one).
Shared prompts only restore once the sessions' own tails outgrow the cache: turns with
longer tool results do, and then agentpark gives back exactly what vLLM evicted.

Both tests check the whole of it: on every later turn the tokens vLLM did not compute
(its own hits plus agentpark's loads, ``cached_tokens``) cover every whole block of the
previous prompt, and tokens and logprobs equal a roomy plain server's.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.vllm_real.agents import TOOL_RESULT, AgentDaemon
from tests.vllm_real.conftest import StartVllm, VllmServer

PATIENT = {"AGENTPARK_CONNECTOR_TIMEOUT_MS": "2000"}  # see test_agentpark_vllm.py
BLOCK = 128  # vLLM's CPU block size
SYSTEM_TOKENS = 700
SESSIONS = 3
LINES = (
    "you are a coding agent working in a large python repository.",
    "tools: read_file(path), run_tests(pattern), apply_patch(diff), search(query).",
    "always read a file before editing it and run the tests after every change.",
    "answer with one tool call at a time; keep every explanation short.",
    "never touch files outside the repository and never push to any remote.",
)


@dataclass
class Answer:
    tokens: list[str]
    logprobs: list[float]
    prompt_tokens: int
    cached_tokens: int  # not computed by vLLM: its prefix-cache hits and agentpark's loads
    restored_tokens: int  # agentpark's loads (the response's kv_transfer_params)


def shared_system_prompt(model: Path, tokens: int = SYSTEM_TOKENS) -> str:
    """A system prompt of about ``tokens`` tokens of the model's own tokenizer (no hub)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    lines: list[str] = []
    while len(tokenizer.encode("\n".join(lines))) < tokens:
        lines.append(f"rule {len(lines)}: {LINES[len(lines) % len(LINES)]}")
    return "\n".join(lines)


def play(
    base_url: str, system: str, names: list[str], turns: int, tool_result: str, *, park: bool
) -> dict[str, list[Answer]]:
    """``turns`` turns of every session, interleaved (each one's turn, then each one's next),
    greedy with logprobs; the sessions differ from their first user message on."""
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    messages: dict[str, list[dict[str, Any]]] = {
        name: [
            {"role": "system", "content": system},
            {"role": "user", "content": f"I am {name}: find the failing test and fix it"},
        ]
        for name in names
    }
    answers: dict[str, list[Answer]] = {name: [] for name in names}
    for _ in range(turns):
        for name in names:
            params = {"session_id": name, "tool": "read_file", "expected_resume_s": 60}
            extra = {"kv_transfer_params": {"agentpark": params}} if park else {}
            response = client.chat.completions.create(
                model=model,
                messages=messages[name],  # type: ignore[arg-type]
                max_tokens=16,
                temperature=0,
                logprobs=True,
                extra_body=extra,
            )
            choice = response.choices[0]
            assert choice.logprobs is not None and choice.logprobs.content is not None
            assert response.usage is not None and response.usage.prompt_tokens_details is not None
            kv = (response.model_extra or {}).get("kv_transfer_params") or {}
            assert not park or kv.get("agentpark"), "no kv_transfer_params.agentpark"
            answers[name].append(
                Answer(
                    [t.token for t in choice.logprobs.content],
                    [t.logprob for t in choice.logprobs.content],
                    response.usage.prompt_tokens,
                    response.usage.prompt_tokens_details.cached_tokens or 0,
                    int((kv.get("agentpark") or {}).get("restored_tokens") or 0),
                )
            )
            n = len(messages[name])
            call = {"name": "read_file", "arguments": json.dumps({"n": n})}
            messages[name] += [
                {
                    "role": "assistant",
                    "content": choice.message.content or "",
                    "tool_calls": [{"id": f"call-{n}", "type": "function", "function": call}],
                },
                {"role": "tool", "tool_call_id": f"call-{n}", "content": tool_result},
            ]
    return answers


def _nothing_recomputed_and_exact(
    ours: dict[str, list[Answer]], reference: dict[str, list[Answer]]
) -> None:
    for name, answers in ours.items():
        for i, (turn, ref) in enumerate(zip(answers, reference[name], strict=True)):
            assert turn.tokens == ref.tokens, f"{name} turn {i + 1}: tokens differ"
            assert turn.logprobs == ref.logprobs, f"{name} turn {i + 1}: logprobs differ"
            if i:  # vLLM and agentpark together kept every whole block the session had
                held = answers[i - 1].prompt_tokens // BLOCK * BLOCK
                assert turn.cached_tokens >= held, f"{name} turn {i + 1}: recomputed its prefix"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentDaemon]:
    shm = Path(tempfile.mkdtemp(prefix="agentpark-vllm-test-", dir="/dev/shm"))
    made = AgentDaemon(tmp_path_factory.mktemp("daemon") / "state", shm / "pool")
    made.start()
    try:
        yield made
    finally:
        made.close()
        for leftover in shm.iterdir():
            leftover.unlink()
        shm.rmdir()


@pytest.fixture(scope="module")
def small_vllm(start_vllm_session: StartVllm, tiny_model: Path, daemon: AgentDaemon) -> VllmServer:
    """vLLM with the connector, prefix caching on, 24 blocks of 128 tokens (3072 tokens)."""
    return start_vllm_session(
        tiny_model,
        daemon_url=daemon.url,
        prefix_caching=True,
        num_gpu_blocks=24,
        extra_args=("--max-model-len", "2048"),
        env=PATIENT,
    )


def test_three_sessions_sharing_a_system_prompt_fit_so_vllm_keeps_them_all(
    tiny_model: Path, daemon: AgentDaemon, small_vllm: VllmServer, plain_vllm: VllmServer
) -> None:
    """The reported case: nothing is restored because nothing was evicted."""
    system = "fit: " + shared_system_prompt(tiny_model)
    names = [f"fit-{i}" for i in range(SESSIONS)]
    ours = play(small_vllm.base_url, system, names, 3, TOOL_RESULT, park=True)
    assert all(a.prompt_tokens > SYSTEM_TOKENS for n in names for a in ours[n])
    assert ours[names[1]][0].cached_tokens >= SYSTEM_TOKENS // BLOCK * BLOCK, "shared by vLLM"
    assert all(daemon.events(n).count("pause") == 3 for n in names), "every turn parked"
    assert not [a for n in names for a in ours[n] if a.restored_tokens], "nothing was evicted"
    _nothing_recomputed_and_exact(
        ours, play(plain_vllm.base_url, system, names, 3, TOOL_RESULT, park=False)
    )


def test_three_sessions_sharing_a_system_prompt_are_restored_once_their_tails_evict(
    tiny_model: Path, daemon: AgentDaemon, small_vllm: VllmServer, plain_vllm: VllmServer
) -> None:
    """Four turns of ~350 tokens each: 5 shared blocks + 3 x 9 of their own, over 24."""
    system = "tails: " + shared_system_prompt(tiny_model)
    names = [f"tails-{i}" for i in range(SESSIONS)]
    result = TOOL_RESULT * 3
    ours = play(small_vllm.base_url, system, names, 4, result, park=True)
    restored = [(n, i) for n in names for i, a in enumerate(ours[n]) if a.restored_tokens > 0]
    assert restored, "a session whose own blocks vLLM evicted is restored from agentpark"
    assert all(
        daemon.events(n).count("resume") == sum(1 for r in restored if r[0] == n) for n in names
    )
    _nothing_recomputed_and_exact(
        ours, play(plain_vllm.base_url, system, names, 4, result, park=False)
    )
