"""``agentpark bench vllm``'s driver over real sockets, against a small OpenAI-compatible
HTTP server that streams one token per request and records what it was sent: the headers
and bodies each client sends, and the multi-turn client loop (conversations in turn, one
request of a conversation at a time, at most ``concurrency`` at once)."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agentpark.bench.vllm import VllmBenchSpec
from agentpark.bench.vllm.drive import Clock, drive
from agentpark.bench.vllm.workload import make_plans
from agentpark.vllm_tools.process import VllmServer
from tests.bench.tokens import TOKENIZER


@dataclass
class Seen:
    """What the server was sent, and how many requests it held at once."""

    requests: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    in_flight: set[str] = field(default_factory=set)
    most_at_once: int = 0
    overlapped: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(seen: Seen) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the body ends when the connection closes

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _send(self, content_type: str, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            models = {"object": "list", "data": [{"id": "m", "object": "model", "created": 0}]}
            self._send("application/json", json.dumps(models).encode())

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            conversation = body["messages"][0]["content"]  # unique per conversation
            with seen.lock:
                seen.requests.append((dict(self.headers), body))
                stream_id = f"chatcmpl-{len(seen.requests)}"  # each its own, as vLLM's
                if conversation in seen.in_flight:
                    seen.overlapped.append(conversation)
                seen.in_flight.add(conversation)
                seen.most_at_once = max(seen.most_at_once, len(seen.in_flight))
            threading.Event().wait(0.05)  # a request takes a while, so clients overlap
            prompt = sum(len(str(m.get("content") or "")) for m in body["messages"])
            token = {"token": "a", "logprob": -1.0, "bytes": None, "top_logprobs": []}
            delta = {"index": 0, "delta": {"content": "a"}, "logprobs": {"content": [token]}}
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": 1,
                "total_tokens": prompt + 1,
                "prompt_tokens_details": {"cached_tokens": 128},
            }
            base = {"id": stream_id, "object": "chat.completion.chunk", "created": 0, "model": "m"}
            chunks = [base | {"choices": [delta]}, base | {"choices": [], "usage": usage}]
            with seen.lock:
                seen.in_flight.discard(conversation)
            lines = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
            self._send("text/event-stream", "".join(lines).encode())

    return Handler


@pytest.fixture
def openai_server(tmp_path: Path) -> Iterator[tuple[VllmServer, Seen]]:
    seen = Seen()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(seen))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    port = httpd.server_address[1]
    yield VllmServer(Path(sys.executable), tmp_path, int(port), tmp_path / "log"), seen
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def test_multi_turn_clients_take_conversations_in_turn_and_send_only_the_messages(
    openai_server: tuple[VllmServer, Seen],
) -> None:
    server, seen = openai_server
    spec = VllmBenchSpec(workload="multi-turn", agents=4, turns=3, concurrency=2)
    plans = make_plans(spec, TOKENIZER)
    makespan, turns = asyncio.run(drive(server, plans, spec, "none", Clock()))
    assert makespan > 0 and [t.error for t in turns] == [None] * 12
    assert [(t.agent, t.turn) for t in turns] == [(a, t) for a in range(4) for t in range(3)]
    assert all(t.prompt_tokens - t.cached_tokens == t.prompt_tokens - 128 for t in turns)
    assert seen.overlapped == [] and seen.most_at_once == 2
    # Each turn keeps the id its stream carried (the daemon's turns name the request by it).
    assert {t.request_id for t in turns} == {f"chatcmpl-{i}" for i in range(1, 13)}
    # The line: a conversation's turns in order, each after the others' turns before it.
    keys = [body["messages"][0]["content"] for _headers, body in seen.requests]
    lengths = [len(body["messages"]) for _headers, body in seen.requests]
    for plan in plans:
        mine = [
            n for key, n in zip(keys, lengths, strict=True) if key == plan.messages[0]["content"]
        ]
        assert mine == [1, 3, 5]
    assert lengths[:3] == [1, 1, 1] and sorted(lengths) == [1] * 4 + [3] * 4 + [5] * 4
    for headers, body in seen.requests:
        assert "kv_transfer_params" not in body and "x-session-id" not in map(str.lower, headers)
        assert [m["role"] for m in body["messages"]] == ["user", "assistant"] * (
            len(body["messages"]) // 2
        ) + ["user"]
    # Each later turn is the previous prompt, the replayed answer and the next user turn.
    plan = plans[0]
    third = next(
        b
        for _h, b in seen.requests
        if b["messages"][0] == plan.messages[0] and len(b["messages"]) == 5
    )
    assert third["messages"][1:] == [
        plan.steps[0].assistant(),
        plan.steps[0].follow(),
        plan.steps[1].assistant(),
        plan.steps[1].follow(),
    ]


@pytest.mark.parametrize("client", ["agentpark", "session-id"])
def test_agents_name_their_sessions_as_their_client_does(
    openai_server: tuple[VllmServer, Seen], client: str
) -> None:
    server, seen = openai_server
    spec = VllmBenchSpec(agents=2, turns=2, time_scale=0.001)
    plans = make_plans(spec, TOKENIZER)
    _makespan, turns = asyncio.run(drive(server, plans, replace(spec), client, Clock()))
    assert [t.error for t in turns] == [None] * 4
    assert len(seen.requests) == 4
    for headers, body in seen.requests:
        session = next(p.session_id for p in plans if p.messages[0] == body["messages"][0])
        lowered = {k.lower(): v for k, v in headers.items()}
        if client == "session-id":
            assert lowered["x-session-id"] == session and "kv_transfer_params" not in body
        else:
            assert "x-session-id" not in lowered
            assert body["kv_transfer_params"]["agentpark"]["session_id"] == session
        assert body["ignore_eos"] is True and body["stream"] is True
