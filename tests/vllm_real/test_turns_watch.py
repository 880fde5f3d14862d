"""A streaming client learns what agentpark did: one GET with its stream chunks' id.

vLLM's streamed answers carry no ``kv_transfer_params`` (vllm#40186), so the turn's
decision is read from the daemon: ``GET /v1/requests/{chunk.id}`` names the request vLLM
ran as ``<chunk.id>-<suffix>``. Under KV pressure (12 blocks; eight conversations need
several times that) the streamed turn's prefix, which vLLM evicted, is restored from the
parked copy, and its end parked again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.vllm_real.agents import AgentDaemon, run_turns, shm_daemon
from tests.vllm_real.conftest import StartVllm

PATIENT = {"AGENTPARK_CONNECTOR_TIMEOUT_MS": "2000"}  # a loaded 2-core machine


def _park(session_id: str) -> dict[str, Any]:
    return {"session_id": session_id, "tool": "read_file", "expected_resume_s": 60}


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[AgentDaemon]:
    with shm_daemon(tmp_path / "state", "agentpark-vllm-watch-") as made:
        yield made


def test_a_streamed_answer_under_kv_pressure_is_told_by_one_get_of_its_chunk_id(
    start_vllm: StartVllm, tiny_model: Path, daemon: AgentDaemon
) -> None:
    small = start_vllm(
        tiny_model,
        daemon_url=daemon.url,
        prefix_caching=True,
        num_gpu_blocks=12,
        extra_args=("--max-model-len", "1024"),
        env=PATIENT,
    )
    names = [f"watch-{i}" for i in range(8)]
    histories: dict[str, list[dict[str, Any]]] = {}
    for name in names:  # each turn fills most of the KV cache: watch-0's blocks are evicted
        _, histories[name] = run_turns(small.base_url, name, 1, params=_park(name))
    client = openai.OpenAI(base_url=small.base_url, api_key="none", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    stream = client.chat.completions.create(
        model=model,
        messages=histories[names[0]],  # type: ignore[arg-type]
        max_tokens=16,
        temperature=0,
        stream=True,
        extra_body={"kv_transfer_params": {"agentpark": _park(names[0])}},
    )
    ids, text = set(), []
    for chunk in stream:
        ids.add(chunk.id)
        text.extend(c.delta.content or "" for c in chunk.choices)
        assert "kv_transfer_params" not in (chunk.model_extra or {})  # why the GET is needed
    assert "".join(text)
    (chunk_id,) = ids
    answer = httpx.get(f"{daemon.url}/v1/requests/{chunk_id}", params={"wait_s": 10}, timeout=30)
    assert answer.status_code == 200, answer.text
    turn = answer.json()
    assert turn["request_id"].startswith(f"{chunk_id}-"), turn["request_id"]
    assert turn["session_id"] == names[0]
    assert (turn["ended"], turn["decision"], turn["parked_tier"]) == (True, "parked", "shm")
    events = daemon.get("/v1/events", session_id=names[0], limit=50)["events"]
    assert turn["restored_tokens"] > 0 and turn["restored_from"] == "shm", (turn, events)
    assert turn["tool"] == "read_file" and turn["park_bytes"] > 0
    turns = daemon.get(f"/v1/sessions/{names[0]}/turns")["turns"]
    assert len(turns) == 2 and turns[0]["request_id"] == turn["request_id"]
    assert turns[1]["restored_tokens"] == 0  # its first turn had nothing parked yet
