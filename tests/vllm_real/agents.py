"""What the real-vLLM tests share: an agentpark daemon in vLLM mode, and an agent's turns.

``AgentDaemon`` is a real daemon (uvicorn on a fixed loopback port, in this process) with
``[vllm] enabled``: it can be stopped and started again on the same port and state dir,
as an operator restarts one. ``run_turns`` plays an agent through the OpenAI SDK: a
system prompt that starts with the session's own id (so no two sessions share a cached
block), a user ask, then per turn the model's answer with a tool call the client writes
itself and the tool's result, greedy, with logprobs.
"""

from __future__ import annotations

import json
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import uvicorn

from agentpark.app import create_app
from agentpark.config import Settings, load_settings
from agentpark.runtime import Runtime

__all__ = ["AgentDaemon", "Turn", "run_turns", "wait_for"]

SYSTEM = "you are a coding agent; tools: read_file, run_tests.\n" + (
    "import os\nprint(os.path.join('a', 'b'))\n" * 12
)
TOOL_RESULT = "def f(x):\n    return x * 2\n" * 8


def wait_for(predicate: Any, timeout: float = 60.0, what: str = "condition") -> None:
    """Wait for something another process makes true (a log line, a counter)."""
    import time

    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        tick.wait(0.05)


@dataclass
class AgentDaemon:
    """A restartable agentpark daemon serving vLLM connectors."""

    state_dir: Path
    pool_path: Path
    port: int = 0
    settings: Settings | None = None
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None
    _app: Any = None
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def runtime(self) -> Runtime:
        runtime: Runtime = self._app.state.runtime
        return runtime

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(128)
        self.port = sock.getsockname()[1]
        self.settings = load_settings(
            None,
            state_dir=self.state_dir,
            server={"port": self.port},
            vllm={"enabled": True, "pool_capacity": 64 << 20, "pool_path": self.pool_path},
            policy={"idle_pause_after_s": 0},
        )
        self._app = create_app(self.settings)
        config = uvicorn.Config(self._app, log_level="warning", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        wait_for(self._ready, 60, "daemon ready")

    def _ready(self) -> bool:
        try:
            return self.http.get(f"{self.url}/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "daemon did not stop"
        self._server = self._thread = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def get(self, path: str, **params: Any) -> Any:
        response = self.http.get(f"{self.url}{path}", params=params)
        response.raise_for_status()
        return (
            response.json() if "json" in response.headers.get("content-type", "") else response.text
        )

    def events(self, session_id: str) -> list[str]:
        page = self.get("/v1/events", session_id=session_id, limit=200)
        return [e["kind"] for e in reversed(page["events"])]

    def metric(self, name: str, **labels: str) -> float:
        from prometheus_client.parser import text_string_to_metric_families

        total = 0.0
        for family in text_string_to_metric_families(self.get("/metrics")):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
        return total

    def close(self) -> None:
        self.stop()
        self.http.close()


@dataclass
class Turn:
    tokens: list[str]
    logprobs: list[float]
    agentpark: dict[str, Any] | None  # the response's kv_transfer_params.agentpark
    text: str


@contextmanager
def shm_daemon(state: Path, prefix: str) -> Iterator[AgentDaemon]:
    """A started vLLM-mode daemon whose pool lives in a private /dev/shm folder; the
    daemon is closed and the folder removed afterwards, whatever happened."""
    shm = Path(tempfile.mkdtemp(prefix=prefix, dir="/dev/shm"))
    made = AgentDaemon(state, shm / "pool")
    try:
        made.start()
        yield made
    finally:
        made.close()
        for leftover in shm.iterdir():
            leftover.unlink()
        shm.rmdir()


def messages_for(session_id: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": f"session {session_id}: {SYSTEM}"},
        {"role": "user", "content": "find the failing test and fix it"},
    ]


def run_turns(
    base_url: str,
    session_id: str,
    turns: int,
    *,
    params: dict[str, Any] | None = None,
    history: list[dict[str, Any]] | None = None,
    max_tokens: int = 16,
    extra_body: dict[str, Any] | None = None,
    extra_headers: dict[str, str] | None = None,
) -> tuple[list[Turn], list[dict[str, Any]]]:
    """``turns`` turns of the agent; ``params``: its kv_transfer_params.agentpark (None:
    a plain client); ``extra_body``, ``extra_headers``: the SDK's, sent as they are.
    Returns the turns and the conversation so far (to go on from)."""
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    messages = list(history) if history is not None else messages_for(session_id)
    done: list[Turn] = []
    for _ in range(turns):
        extra = dict(extra_body or {})
        if params is not None:
            extra["kv_transfer_params"] = {"agentpark": params}
        response = client.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0,
            logprobs=True,
            extra_body=extra,
            extra_headers=extra_headers,
        )
        choice = response.choices[0]
        assert choice.logprobs is not None and choice.logprobs.content is not None
        kv = (response.model_extra or {}).get("kv_transfer_params") or {}
        done.append(
            Turn(
                [t.token for t in choice.logprobs.content],
                [t.logprob for t in choice.logprobs.content],
                kv.get("agentpark"),
                choice.message.content or "",
            )
        )
        n = len(messages)
        messages.append(
            {
                "role": "assistant",
                "content": choice.message.content or "",
                "tool_calls": [
                    {
                        "id": f"call-{n}",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": json.dumps({"n": n})},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"call-{n}", "content": TOOL_RESULT})
    return done, messages
