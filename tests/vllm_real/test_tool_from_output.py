"""The tool a turn calls, read from the turn's own output (real tokenizer, real vLLM).

The tokenizer tests decode real token ids with the tiny model's own tokenizer (made by
``agentpark make-model``; its ``<tool_call>`` markers are special tokens). The server test
makes the random-weight model's output a hermes tool call deterministically with vLLM's own
structured outputs (a ``choice`` of one string) and names the session only as a stock client
does (``X-Session-ID``, no tool, no agentpark params): the daemon must still record the
tool's name, and the session's next request must close the pause. One vLLM start.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentpark.connectors.toolcalls import TAIL_TOKENS, Found, ToolCallReader, tokenizer_from_path
from tests.vllm_real.agents import AgentDaemon, messages_for, wait_for
from tests.vllm_real.conftest import StartVllm, VllmServer

PATIENT = {"AGENTPARK_CONNECTOR_TIMEOUT_MS": "2000"}  # a loaded 2-core machine
CALL = '<tool_call>{"name": "run_tests", "arguments": {"k": "parser"}}</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "run the test suite",
            "parameters": {"type": "object", "properties": {"k": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    return tokenizer_from_path(str(tiny_model))()


def _reader(tiny_model: Path, fmt: str = "auto") -> ToolCallReader:
    return ToolCallReader(fmt, tokenizer_from_path(str(tiny_model)))


def test_the_models_own_tokens_of_a_call_name_the_tool(tiny_model: Path, tokenizer: Any) -> None:
    ids = tokenizer.encode("I will run them.\n" + CALL + "<|im_end|>")
    assert tokenizer.convert_tokens_to_ids("<tool_call>") in ids  # a special token
    assert _reader(tiny_model).read(ids) == Found("run_tests")
    assert _reader(tiny_model, "hermes").read(ids) == Found("run_tests")
    assert _reader(tiny_model, "mistral").read(ids) == Found()


def test_the_chat_templates_assistant_turn_names_its_tool(tiny_model: Path, tokenizer: Any) -> None:
    call = {"id": "c1", "type": "function"}
    call["function"] = {"name": "read_file", "arguments": json.dumps({"path": "a.py"})}
    before = messages_for("tpl")
    rendered = tokenizer.apply_chat_template(
        [*before, {"role": "assistant", "content": "", "tool_calls": [call]}], tokenize=False
    )
    prompt = tokenizer.apply_chat_template(before, tokenize=False, add_generation_prompt=True)
    assert rendered.startswith(prompt)
    output = tokenizer.encode(rendered[len(prompt) :])  # what the model would have written
    assert _reader(tiny_model).read(output).tool == "read_file"


def test_only_the_tail_is_decoded(tiny_model: Path, tokenizer: Any) -> None:
    call = tokenizer.encode(CALL)
    filler = tokenizer.encode("x = 1\n" * 400)
    assert len(filler) > TAIL_TOKENS
    assert _reader(tiny_model).read(filler + call).tool == "run_tests"
    assert _reader(tiny_model).read(call + filler) == Found()  # beyond the tail: not read


def test_a_broken_call_gives_no_tool_and_says_why(tiny_model: Path, tokenizer: Any) -> None:
    found = _reader(tiny_model).read(tokenizer.encode('<tool_call>{"name": run_tests}'))
    assert found.tool is None and found.invalid is not None


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentDaemon]:
    shm = Path(tempfile.mkdtemp(prefix="agentpark-toolout-test-", dir="/dev/shm"))
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
def server(start_vllm_session: StartVllm, tiny_model: Path, daemon: AgentDaemon) -> VllmServer:
    return start_vllm_session(
        tiny_model,
        daemon_url=daemon.url,
        extra_args=(
            "--max-model-len",
            "1024",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
        ),
        env=PATIENT,
    )


def _chat(server: VllmServer, session: str, messages: list[dict[str, Any]], **body: Any) -> Any:
    """One chat turn as a stock client sends it: the session in vLLM's header only."""
    with httpx.Client(timeout=120) as http:
        model = http.get(f"{server.base_url}/models").json()["data"][0]["id"]
        response = http.post(
            f"{server.base_url}/chat/completions",
            headers={"X-Session-ID": session},
            json={"model": model, "messages": messages, "temperature": 0, **body},
        )
    assert response.status_code == 200, response.text
    return response.json()


def test_a_turn_that_ends_in_a_tool_call_names_the_tool_at_the_daemon(
    server: VllmServer, daemon: AgentDaemon
) -> None:
    session = "tool-from-output"
    messages = messages_for(session)
    first = _chat(
        server,
        session,
        messages,
        tools=TOOLS,
        max_tokens=64,
        structured_outputs={"choice": [CALL]},
    )
    message = first["choices"][0]["message"]
    # vLLM's own hermes parser reads the same call from the same output
    assert [c["function"]["name"] for c in message.get("tool_calls") or []] == ["run_tests"]
    ours = first["kv_transfer_params"]["agentpark"]
    assert ours["decision"] in ("parked", "kept"), ours

    def recorded() -> bool:
        return bool(daemon.get(f"/v1/sessions/{session}")["tool"] == "run_tests")

    wait_for(recorded, 30, "the daemon records the tool of the turn's output")
    row = daemon.get(f"/v1/sessions/{session}")
    assert row["pause_count"] >= 1 and row["state"] in ("parked", "active"), row

    # the session's next request (the tool's result) closes the pause
    call = message["tool_calls"][0]
    messages += [
        {"role": "assistant", "content": message.get("content") or "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "1 passed"},
    ]
    second = _chat(server, session, messages, max_tokens=4)
    assert second["choices"][0]["message"] is not None

    def returned() -> bool:
        return "tool_return" in daemon.events(session)

    wait_for(returned, 30, "the session's next request closes the pause (tool_return)")
    closing = [
        e
        for e in daemon.get("/v1/events", session_id=session, limit=200)["events"]
        if e["kind"] == "tool_return"
    ]
    assert closing[0]["detail"] == "run_tests" and closing[0]["duration_ms"] > 0, closing
    tools = daemon.get("/v1/admin/policy")["tools"]
    assert tools["run_tests"]["observed"] >= 1, tools  # the pause learned for the tool
