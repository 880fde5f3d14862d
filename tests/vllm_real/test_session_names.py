"""Sessions named the way vLLM names them, and agentpark's kv_hints actions (real vLLM).

A stock OpenAI client that says nothing of agentpark: only ``X-Session-ID`` (a header), or
only ``session_id`` in the body, as vLLM's own multi-turn benchmark does. Under KV pressure
(12 blocks of KV cache, five interleaved sessions) their later turns are restored, and
bit for bit: tokens and logprobs equal to a roomy plain server's (``plain_vllm``).

``kv_hints`` reach a request through vLLM's engine API only (its OpenAI server does not
carry them in 0.32): those tests drive ``LLMEngine`` in a child process
(tests/vllm_real/hinted_engine.py) with the connector on.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentpark.vllm_tools.launch import vllm_env
from tests.vllm_real.agents import SYSTEM, AgentDaemon, Turn, run_turns, shm_daemon, wait_for
from tests.vllm_real.conftest import DEFAULT_ENV, StartVllm, VllmServer
from tests.vllm_real.hinted_engine import MARK

PATIENT = {"AGENTPARK_CONNECTOR_TIMEOUT_MS": "2000"}  # a loaded 2-core machine
NAMES = 5
IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # the engine core in the child itself


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentDaemon]:
    state = tmp_path_factory.mktemp("daemon") / "state"
    with pytest.MonkeyPatch.context() as env:
        # What is tested here is parking and restoring by name: every turn end parks (the
        # adaptive rule would pin short pauses, served by vLLM's own cache instead).
        env.setenv("AGENTPARK_VLLM__TURN_END", "park")
        with shm_daemon(state, "agentpark-names-test-") as made:
            yield made


@pytest.fixture(scope="module")
def small_vllm(start_vllm_session: StartVllm, tiny_model: Path, daemon: AgentDaemon) -> VllmServer:
    """The connector under KV pressure: 12 blocks hold about one session."""
    return start_vllm_session(
        tiny_model,
        daemon_url=daemon.url,
        prefix_caching=True,
        num_gpu_blocks=12,
        extra_args=("--max-model-len", "1024"),
        env=PATIENT,
    )


def _restored(turn: Turn) -> int:
    assert turn.agentpark is not None, "the response carries no kv_transfer_params.agentpark"
    return int(turn.agentpark["restored_tokens"])


def _interleaved(
    server: VllmServer, names: list[str], naming: Callable[[str], dict[str, Any]]
) -> dict[str, list[Turn]]:
    """Three turns of each session, every session's turn before anyone's next one."""
    histories: dict[str, list[dict[str, Any]]] = {}
    ours: dict[str, list[Turn]] = {n: [] for n in names}
    for _ in range(3):
        for name in names:
            turns, histories[name] = run_turns(
                server.base_url, name, 1, history=histories.get(name), **naming(name)
            )
            ours[name].extend(turns)
    return ours


def _restored_exactly(ours: dict[str, list[Turn]], plain: VllmServer) -> None:
    for name, turns in ours.items():
        assert _restored(turns[2]) > 0, f"{name}: turn 3 restored nothing"
        reference, _ = run_turns(plain.base_url, name, 3)
        for i, turn in enumerate(turns):
            assert turn.tokens == reference[i].tokens, f"{name} turn {i + 1}: tokens"
            assert turn.logprobs == reference[i].logprobs, f"{name} turn {i + 1}: logprobs"


@pytest.mark.parametrize(
    ("label", "naming"),
    [
        ("header", lambda name: {"extra_headers": {"X-Session-ID": name}}),
        ("body", lambda name: {"extra_body": {"session_id": name}}),
    ],
)
def test_a_stock_client_naming_its_session_vllms_way_is_restored_exactly(
    daemon: AgentDaemon,
    small_vllm: VllmServer,
    plain_vllm: VllmServer,
    label: str,
    naming: Callable[[str], dict[str, Any]],
) -> None:
    names = [f"{label}-{i}" for i in range(NAMES)]
    ours = _interleaved(small_vllm, names, naming)
    _restored_exactly(ours, plain_vllm)
    for name in names:
        assert daemon.get(f"/v1/sessions/{name}")["session_id"] == name


class HintedEngine:
    """The engine-API child (tests/vllm_real/hinted_engine.py): one request at a time."""

    def __init__(self, python: Path, model: Path, daemon_url: str, log: Path) -> None:
        self.log = log.open("w")
        self.process = subprocess.Popen(
            [str(python), "-m", "tests.vllm_real.hinted_engine", str(model), daemon_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=vllm_env({**os.environ, **DEFAULT_ENV, **PATIENT, **IN_PROCESS}),
        )
        assert self._read() == {"ready": True}, f"the engine did not start; see {log}"

    def _read(self) -> Any:
        """The child's next answer; vLLM's own output on the way goes to the log."""
        assert self.process.stdout is not None
        while True:
            line = self.process.stdout.readline()
            assert line, f"the engine exited ({self.process.poll()}); see {self.log.name}"
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
            self.log.write(line)
            self.log.flush()

    def ask(self, request_id: str, **fields: Any) -> dict[str, Any]:
        """One request run to its end; its prompt starts with its session's own text."""
        assert self.process.stdin is not None
        head = f"session {fields.get('session_id')}: {SYSTEM}"
        ask = {"request_id": request_id, "prompt": head + fields.pop("more", ""), **fields}
        self.process.stdin.write(json.dumps(ask) + "\n")
        self.process.stdin.flush()
        answer: dict[str, Any] = self._read()
        return answer

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=120)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            if self.process.stdout is not None:
                self.process.stdout.close()
            self.log.close()


@pytest.fixture(scope="module")
def hinted(
    vllm_python: Path,
    tiny_model: Path,
    daemon: AgentDaemon,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[HintedEngine]:
    log = tmp_path_factory.mktemp("hinted") / "engine.log"
    engine = HintedEngine(vllm_python, tiny_model, daemon.url, log)
    try:
        yield engine
    finally:
        engine.close()


def _hints(*actions: dict[str, Any]) -> dict[str, Any]:
    return {"protocol_version": "1", "message_id": "m-1", "actions": list(actions)}


def _action(kind: str, payload: dict[str, Any], version: str = "1") -> dict[str, Any]:
    return {"action_id": "a-1", "action_type": kind, "action_version": version, "payload": payload}


def _degraded(daemon: AgentDaemon) -> dict[str, int]:
    counts: dict[str, int] = daemon.get("/v1/vllm")["degraded"]
    return counts


def test_a_malformed_agentpark_hint_is_served_parks_nothing_and_is_counted(
    daemon: AgentDaemon, hinted: HintedEngine
) -> None:
    before = _degraded(daemon).get("hint_invalid", 0)
    bad = _hints(_action("agentpark.pause", {"tool": "read_file", "expected_resume_s": "soon"}))
    answer = hinted.ask("bad-hint-1", session_id="hint-bad", kv_hints=bad)
    assert answer["tokens"], "the request must still be served"
    ours = answer["kv_transfer_params"]["agentpark"]
    assert ours["decision"] == "refused" and "expected_resume_s" in ours["why"]
    # The connector reports its counts with its next call to the daemon: a named turn.
    good = hinted.ask("good-1", session_id="hint-flush")
    assert good["kv_transfer_params"]["agentpark"]["decision"] in ("parked", "kept")
    wait_for(lambda: _degraded(daemon).get("hint_invalid", 0) > before, 30, "hint_invalid")
    ids = {s["session_id"] for s in daemon.get("/v1/sessions", limit=1000)["sessions"]}
    assert "hint-bad" not in ids


def test_pause_and_release_hints_park_then_delete_and_foreign_ones_are_counted(
    daemon: AgentDaemon, hinted: HintedEngine
) -> None:
    before = _degraded(daemon).get("hint_ignored", 0)
    pause = _action("agentpark.pause", {"tool": "read_file", "expected_resume_s": 60})
    foreign = _action("vendor.retain", {"ttl_s": "whatever they like"})
    first = hinted.ask("pause-1", session_id="hinted", kv_hints=_hints(pause, foreign))
    ours = first["kv_transfer_params"]["agentpark"]
    assert ours["decision"] == "parked" and ours["hints"] == ["agentpark.pause/1"]
    session = daemon.get("/v1/sessions/hinted")
    assert session["state"] == "parked" and session["tool"] == "read_file"
    release = _hints(_action("agentpark.release", {}))
    last = hinted.ask("release-1", session_id="hinted", kv_hints=release, more="and then?")
    assert last["tokens"]
    ours = last["kv_transfer_params"]["agentpark"]
    assert ours["decision"] == "released" and ours["restored_tokens"] > 0
    assert daemon.http.get(f"{daemon.url}/v1/sessions/hinted").status_code == 404  # deleted
    assert daemon.events("hinted")[-1] == "delete"
    hinted.ask("flush-2", session_id="hint-flush-2")  # carries the counts to the daemon
    wait_for(lambda: _degraded(daemon).get("hint_ignored", 0) > before, 30, "hint_ignored")
