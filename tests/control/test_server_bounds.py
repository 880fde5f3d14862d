"""The control server's bounds (agentpark.control.server), against real unix sockets.

Stalled large frames do not grow the daemon past its budget, a flood of idle connections
does not keep the real connector out, deep JSON is a refusal, past the connection limit a
connection is told so, and a slow handler does not hold up other connections.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentpark.auth import ANONYMOUS
from agentpark.connectors.client import ControlClient
from agentpark.connectors.protocol import MAX_BLOB, encode_frame, read_frame
from agentpark.control.server import Connection, ControlServer, Limits
from tests.connectors.conftest import ControlDaemon
from tests.control.harness import Raw
from tests.harness import wait_until


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    return sock


def test_stalled_large_frames_stay_within_the_budget(control_daemon: ControlDaemon) -> None:
    server = control_daemon.service.server
    path = control_daemon.service.socket_path
    payload = memoryview(bytes(MAX_BLOB))
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(_connect(path)) for _ in range(20)]
        # Python's own allocations, not RSS: the daemon shares this process, and glibc's
        # arenas keep freed chunks (RSS grew by 97 MiB on a loaded CI box for 64 MiB held).
        tracemalloc.start()
        stack.callback(tracemalloc.stop)
        baseline, _ = tracemalloc.get_traced_memory()
        sent = dict.fromkeys(socks, 0)
        for sock in socks:
            sock.setblocking(False)
            sock.sendall(struct.pack("<II", 2, MAX_BLOB) + b"{}")
        # Feed every connection all but the last byte, as fast as the daemon takes it; a
        # connection it does not read stops being writable once the kernel's buffer is full.
        while True:
            wanting = [s for s in socks if sent[s] < MAX_BLOB - 1]
            _, writable, _ = select.select([], wanting, [], 0.5)
            if not writable:
                break
            for sock in writable:
                with contextlib.suppress(BlockingIOError):
                    sent[sock] += sock.send(payload[sent[sock] : MAX_BLOB - 1])
        assert server.buffered <= server.limits.max_buffered
        _, peak = tracemalloc.get_traced_memory()
        grown = peak - baseline  # 20 x 16 MiB were announced; the budget is 64 MiB
        assert grown < server.limits.max_buffered + (16 << 20), f"{grown >> 20} MiB held"
        assert server.buffered > server.limits.max_buffered - 2 * MAX_BLOB  # it was filled
        # A connector still gets its answers meanwhile (small frames fit in the budget).
        client = ControlClient(None, socket_path=str(path), timeout_s=0.5)
        assert client.call("degraded", counts={"timeout": 1}) is not None
        client.close()


def test_the_real_connector_connects_under_500_idle_connections(
    control_daemon: ControlDaemon,
) -> None:
    path = control_daemon.service.socket_path
    idle = [_connect(path) for _ in range(500)]
    try:
        server = control_daemon.service.server
        wait_until(lambda: server.connections >= 500, timeout=30)
        late: list[dict[str, int]] = []
        for _ in range(50):
            client = ControlClient(None, socket_path=str(path), timeout_s=0.05)
            answer = client.call("degraded", counts={"timeout": 1})  # connect, hello, call
            if answer is None or not answer["ok"]:
                late.append(dict(client.counts))
            client.close()
        # With a thread per connection and a backlog of 64, 28 in 100 missed their 50 ms.
        # Two misses are let go: the client shares this process's GIL and a loaded CI box.
        assert len(late) <= 2, late
    finally:
        for sock in idle:
            sock.close()


def test_a_deeply_nested_frame_is_a_bad_request(control_daemon: ControlDaemon) -> None:
    conn = Raw(control_daemon.service.socket_path)
    deep = b"[" * 100_000 + b"]" * 100_000
    for body in (deep, b'{"op": "hello", "x": ' + deep + b"}", json.dumps(_nest(17)).encode()):
        answer = conn.send(body)
        assert answer["ok"] is False and answer["cause"] == "bad_request", answer
    assert conn.hello()["ok"]  # the connection is still served
    conn.close()


def _nest(depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {"op": "hello"}
    for _ in range(depth):
        out = {"op": "hello", "x": out}
    return out


def test_a_frame_over_its_bounds_is_refused_before_it_is_read(
    control_daemon: ControlDaemon,
) -> None:
    sock = _connect(control_daemon.service.socket_path)
    sock.settimeout(10)
    sock.sendall(struct.pack("<II", 2, 64 << 20) + b"{}")  # 64 MiB announced, none sent
    answer, _ = read_frame(sock)
    assert answer["cause"] == "bad_request" and "too large" in answer["error"]
    assert sock.recv(1) == b""  # then the connection ends
    sock.close()


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[tuple[ControlServer, threading.Event]]:
    """A real server with a stand-in handler: echoes, or waits for ``release`` on "block";
    a "hello" names the connection as the daemon's does (no hello timeout after it)."""
    release = threading.Event()

    def handler(conn: Connection, message: dict[str, Any], blob: bytes) -> tuple[Any, bytes]:
        if message.get("op") == "hello":
            conn.identity = ANONYMOUS
        if message.get("op") == "block":
            release.wait(10)
        return {"ok": True, "op": message.get("op"), "conn": conn.id}, b""

    limits = Limits(max_connections=3, hello_timeout_s=0.3, frame_timeout_s=0.3)
    server = ControlServer(tmp_path / "echo.sock", handler, limits=limits)
    server.start()
    yield server, release
    release.set()
    server.stop()


def test_past_the_connection_limit_a_connection_is_told_so(
    echo: tuple[ControlServer, threading.Event],
) -> None:
    server, _ = echo
    kept = [Raw(server.path) for _ in range(3)]
    for conn in kept:  # said hello: not closed as silent (0.3 s) while the test runs
        assert conn.hello()["ok"]
    extra = _connect(server.path)
    extra.settimeout(10)
    answer, _ = read_frame(extra)
    assert answer["ok"] is False and answer["cause"] == "too_many_connections"
    extra.close()
    client = ControlClient(None, socket_path=str(server.path), timeout_s=1.0)
    assert client.call("ping") is None and client.counts["too_many_connections"] == 1
    kept.pop().close()
    wait_until(lambda: server.connections == 2, timeout=10)
    again = Raw(server.path)
    assert again.send({"op": "ping"})["ok"]
    for conn in (*kept, again):
        conn.close()


def test_a_stalled_frame_or_a_silent_connection_is_closed_in_time(
    echo: tuple[ControlServer, threading.Event],
) -> None:
    server, _ = echo
    silent, partial = _connect(server.path), _connect(server.path)
    partial.sendall(struct.pack("<II", 100, 0) + b'{"op"')  # and nothing more
    for sock in (silent, partial):
        sock.settimeout(10)
        started = time.monotonic()
        assert sock.recv(1) == b""  # closed by the daemon
        assert time.monotonic() - started < 5
        sock.close()


def test_a_slow_handler_holds_up_only_its_own_connection(
    echo: tuple[ControlServer, threading.Event],
) -> None:
    server, release = echo
    slow, quick = _connect(server.path), Raw(server.path)
    slow.settimeout(10)
    slow.sendall(encode_frame({"op": "block"}))
    slow.sendall(encode_frame({"op": "after"}))  # answered after "block", in order
    assert quick.send({"op": "ping"})["op"] == "ping"
    release.set()
    assert read_frame(slow)[0]["op"] == "block"
    assert read_frame(slow)[0]["op"] == "after"
    slow.close()
    quick.close()
