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

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.vllm_real.agents import TOOL_RESULT, AgentDaemon, shm_daemon
from tests.vllm_real.conftest import StartVllm, VllmServer
from tests.vllm_real.conversations import (
    BLOCK,
    nothing_recomputed_and_exact,
    opening,
    play,
    system_prompt,
)

PATIENT = {"AGENTPARK_CONNECTOR_TIMEOUT_MS": "2000"}  # see test_agentpark_vllm.py
SYSTEM_TOKENS = 700
SESSIONS = 3


def _park(name: str) -> Mapping[str, Any]:
    params = {"session_id": name, "tool": "read_file", "expected_resume_s": 60}
    return {"kv_transfer_params": {"agentpark": params}}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentDaemon]:
    with shm_daemon(tmp_path_factory.mktemp("daemon") / "state", "agentpark-vllm-test-") as made:
        yield made


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
    system = system_prompt(tiny_model, SYSTEM_TOKENS, "fit")
    talks = {name: opening(system, name) for name in (f"fit-{i}" for i in range(SESSIONS))}
    ours = play(small_vllm.base_url, talks, 3, TOOL_RESULT, _park)
    assert all(a.prompt_tokens > SYSTEM_TOKENS for n in talks for a in ours[n])
    assert ours["fit-1"][0].cached_tokens >= SYSTEM_TOKENS // BLOCK * BLOCK, "shared by vLLM"
    assert all(daemon.events(n).count("pause") == 3 for n in talks), "every turn parked"
    assert not [a for n in talks for a in ours[n] if a.restored_tokens], "nothing was evicted"
    nothing_recomputed_and_exact(ours, play(plain_vllm.base_url, talks, 3, TOOL_RESULT))


def test_three_sessions_sharing_a_system_prompt_are_restored_once_their_tails_evict(
    tiny_model: Path, daemon: AgentDaemon, small_vllm: VllmServer, plain_vllm: VllmServer
) -> None:
    """Four turns of ~350 tokens each: 5 shared blocks + 3 x 9 of their own, over 24."""
    system = system_prompt(tiny_model, SYSTEM_TOKENS, "tails")
    talks = {name: opening(system, name) for name in (f"tails-{i}" for i in range(SESSIONS))}
    result = TOOL_RESULT * 3
    ours = play(small_vllm.base_url, talks, 4, result, _park)
    restored = {n: sum(1 for a in ours[n] if a.restored_tokens) for n in talks}
    assert sum(restored.values()), "a session whose own blocks vLLM evicted is restored"
    assert all(daemon.events(n).count("resume") == restored[n] for n in talks)
    nothing_recomputed_and_exact(ours, play(plain_vllm.base_url, talks, 4, result))
