"""Parked blocks addressed by content (issue 19, item 5): tests written ahead of the store.

NEEDS THE CONTENT-ADDRESSED BLOCK STORE (issue 19 items 1 and 3); each fails on main, where
a parked copy is per session and a request with no session is never parked:

- eight sessions sharing a 1k-token system prompt, parked: the pool holds the prefix once
  (bytes parked = one prefix + eight tails, read from /v1/host). On main the pool holds
  eight prefixes.
- two ``cache_salt``s with the same prompt: no block crosses between them (a session of
  the second salt parks its whole copy, an anonymous request of a third salt reuses
  nothing), while a second session of the first salt adds no byte. On main the last part
  fails: it parks its whole copy again.
- a client that sends nothing at all, restored by content on its turn 3 under KV pressure
  (24 blocks): on main nothing is parked for it, so vLLM recomputes what it evicted.

One daemon and one connector server (prefix caching on, 24 blocks of 128 tokens,
max-model-len 2048) for the module; each test has its own system prompt, so no block is
shared between tests, and measures the pool by differences.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.vllm_real.agents import TOOL_RESULT, AgentDaemon, shm_daemon, wait_for
from tests.vllm_real.conftest import StartVllm, VllmServer
from tests.vllm_real.conversations import (
    BLOCK,
    nothing_recomputed_and_exact,
    opening,
    play,
    system_prompt,
)

PATIENT = {"AGENTPARK_CONNECTOR_TIMEOUT_MS": "2000"}  # see test_agentpark_vllm.py


def _session(name: str) -> dict[str, Any]:
    params = {"session_id": name, "tool": "read_file", "expected_resume_s": 60}
    return {"kv_transfer_params": {"agentpark": params}}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentDaemon]:
    with shm_daemon(tmp_path_factory.mktemp("daemon") / "state", "agentpark-vllm-test-") as made:
        yield made


@pytest.fixture(scope="module")
def small_vllm(start_vllm_session: StartVllm, tiny_model: Path, daemon: AgentDaemon) -> VllmServer:
    return start_vllm_session(
        tiny_model,
        daemon_url=daemon.url,
        prefix_caching=True,
        num_gpu_blocks=24,
        extra_args=("--max-model-len", "2048"),
        env=PATIENT,
    )


def _parked_bytes(daemon: AgentDaemon) -> int:
    return int(daemon.get("/v1/host")["tiers"]["shm"]["used_bytes"])


def _block_bytes(daemon: AgentDaemon) -> int:
    return int(daemon.get("/v1/host")["pool"]["block_bytes"])


def _wait_parked(daemon: AgentDaemon, names: list[str]) -> None:
    for name in names:
        wait_for(
            lambda n=name: daemon.get(f"/v1/sessions/{n}")["state"] == "parked",
            60,
            f"{name} parked",
        )


def test_eight_sessions_sharing_a_1k_system_prompt_park_the_prefix_once(
    tiny_model: Path, daemon: AgentDaemon, small_vllm: VllmServer
) -> None:
    """NEEDS THE CONTENT-ADDRESSED STORE: bytes parked = one prefix + eight tails."""
    system = system_prompt(tiny_model, 1000, "eight")
    names = [f"eight-{i}" for i in range(8)]
    talks = {n: opening(system, n) for n in names}
    for talk in talks.values():  # a block or two of each one's own after the prompt
        talk[1]["content"] += "\n" + TOOL_RESULT
    before = _parked_bytes(daemon)
    ours = play(small_vllm.base_url, talks, 1, TOOL_RESULT, _session)
    _wait_parked(daemon, names)
    shared = ours[names[1]][0].cached_tokens // BLOCK  # vLLM's own hit: the common blocks
    assert shared >= 1000 // BLOCK, "the system prompt's blocks are common to all"
    block = _block_bytes(daemon)
    whole = [int(daemon.get(f"/v1/sessions/{n}")["kv_bytes"]) // block for n in names]
    assert all(w > shared for w in whole), f"each session has a tail of its own: {whole}"
    expected = (shared + sum(w - shared for w in whole)) * block
    assert _parked_bytes(daemon) - before == expected, (
        f"one prefix of {shared} blocks and eight tails ({expected} bytes), "
        f"not one copy per session ({sum(whole) * block} bytes)"
    )


def test_two_cache_salts_with_the_same_prompt_share_no_block(
    tiny_model: Path, daemon: AgentDaemon, small_vllm: VllmServer
) -> None:
    """NEEDS THE CONTENT-ADDRESSED STORE: blocks are shared within a salt, never across."""
    system = system_prompt(tiny_model, 700, "salted")
    talk = opening(system, "a salted agent")  # the very same messages for every request

    def salted(salt: str, named: bool = True) -> Callable[[str], Mapping[str, Any]]:
        def extra(name: str) -> Mapping[str, Any]:
            return {"cache_salt": salt, **(_session(name) if named else {})}

        return extra

    block = _block_bytes(daemon)
    grew: dict[str, int] = {}
    answers = {}
    for name, salt in (("salt-a-1", "a"), ("salt-b-1", "b"), ("salt-a-2", "a")):
        before = _parked_bytes(daemon)
        answers[name] = play(small_vllm.base_url, {name: talk}, 1, TOOL_RESULT, salted(salt))[name][
            0
        ]
        _wait_parked(daemon, [name])
        grew[name] = _parked_bytes(daemon) - before
    whole = int(daemon.get("/v1/sessions/salt-a-1")["kv_bytes"])
    assert whole >= 5 * block
    assert grew["salt-a-1"] == whole
    assert grew["salt-b-1"] == whole, "salt b shares no block with salt a"
    assert answers["salt-b-1"].cached_tokens == 0, "nothing of salt a reached salt b"
    assert grew["salt-a-2"] == 0, "a second session of salt a adds no block"
    anonymous = play(small_vllm.base_url, {"c": talk}, 1, TOOL_RESULT, salted("c", False))
    assert anonymous["c"][0].cached_tokens == 0, "nothing of salts a or b reached salt c"
    assert anonymous["c"][0].tokens == answers["salt-a-1"].tokens


def test_a_client_that_sends_nothing_is_restored_by_content_on_turn_3_under_kv_pressure(
    tiny_model: Path, daemon: AgentDaemon, small_vllm: VllmServer, plain_vllm: VllmServer
) -> None:
    """NEEDS ANONYMOUS SESSIONS (item 3): four plain OpenAI conversations, no extra_body,
    a ~700-token system prompt each, interleaved: 4 x 7 whole blocks by turn 3, over 24."""
    talks = {
        name: opening(system_prompt(tiny_model, 700, name), name)
        for name in (f"anonymous-{i}" for i in range(4))
    }
    avoided = daemon.get("/v1/host")["counters"]["prefill_tokens_avoided"]
    ours = play(small_vllm.base_url, talks, 3, TOOL_RESULT)
    gained = daemon.get("/v1/host")["counters"]["prefill_tokens_avoided"] - avoided
    assert gained > 0, "agentpark restored by content what vLLM evicted"
    nothing_recomputed_and_exact(ours, play(plain_vllm.base_url, talks, 3, TOOL_RESULT))
