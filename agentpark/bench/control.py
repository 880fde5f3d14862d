"""``agentpark bench control``: the control plane's latency with many sessions.

A real daemon (``agentpark serve`` in a child process, its own SQLite file and a dram
tier; shm and disk off, so nothing is left in /dev/shm) gets ``--sessions`` sessions
created over HTTP, one at a time. Then, with all of them live, it times over HTTP (one
request at a time, a keep-alive connection, the same client an orchestrator uses):

- ``get`` of a random session, ``list`` of a page of 100 at a random cursor, ``/v1/host``;
- ``pause`` (forced, into dram) and ``resume`` of one-block sessions (a short prompt and one
  generated token: one KV block each), copy included.

Each operation prints its p50 and p99 and the target it is held to (at 10,000 sessions:
get p99 < 2 ms, pause and resume p99 < 5 ms, create p50 < 2 ms). The times include the
client's own work and loopback HTTP: what an orchestrator on the host sees; the targets
are judged on them. Next to them, the daemon's own share of the same requests (its
``Server-Timing: app;dur=``, from the request's arrival to the answer's start): the rest
is the client (httpx, the answer's model) and the loopback round trip. The daemon's
resident memory is read from /proc after the sessions are made.
"""

from __future__ import annotations

import gc
import http.client
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
from rich.console import Console
from rich.table import Table

from agentpark import client_calls as calls
from agentpark.api.timing import SERVER_TIMING, app_ms
from agentpark.bench.common import progress_bar, stdout_console
from agentpark.client import AgentparkAPIError, AgentparkClient

__all__ = ["ControlResult", "run_control_bench"]

READY_LINE = "engine warm; ready"
"""What agentpark.runtime logs (INFO) once the daemon serves requests."""

TARGETS_MS = {"create": ("p50", 2.0), "get": ("p99", 2.0), "pause": ("p99", 5.0)}
TARGETS_MS["resume"] = ("p99", 5.0)


@dataclass
class ControlResult:
    sessions: int
    samples: int
    times_ms: dict[str, list[float]] = field(default_factory=dict)
    daemon_ms: dict[str, list[float]] = field(default_factory=dict)  # its Server-Timing
    rss_bytes: int | None = None

    def add(self, op: str, seconds: float, daemon_ms: float | None = None) -> None:
        self.times_ms.setdefault(op, []).append(seconds * 1e3)
        if daemon_ms is not None:
            self.daemon_ms.setdefault(op, []).append(daemon_ms)

    def quantile(self, op: str, q: float, *, daemon: bool = False) -> float | None:
        values = sorted((self.daemon_ms if daemon else self.times_ms).get(op, []))
        return values[min(len(values) - 1, int(q * len(values)))] if values else None


class _Daemon:
    """``agentpark serve`` as a child process on a free loopback port."""

    def __init__(self, state_dir: Path, blocks: int) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        config = state_dir / "bench.toml"
        config.write_text(
            f'state_dir = "{state_dir}"\nlog_level = "info"  # READY_LINE is an INFO line\n'
            f"[pool]\nblock_size = 16\nnum_blocks = {blocks}\n"
            "[tiers.shm]\ncapacity = 0\n[tiers.disk]\ncapacity = 0\n"
            "[policy]\nidle_pause_after_s = 0\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPARK_")}
        cmd = [sys.executable, "-m", "agentpark", "serve", "--config", str(config)]
        self.proc = subprocess.Popen(
            [*cmd, "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = f"http://127.0.0.1:{port}"
        self._ready = False
        self._told = threading.Event()  # the daemon said it is ready, or its stderr ended
        self._log: deque[str] = deque(maxlen=20)
        self._reader = threading.Thread(target=self._read_log, name="bench-log", daemon=True)
        self._reader.start()

    def _read_log(self) -> None:
        """Drain the daemon's log; the runtime logs READY_LINE once the engine is warm."""
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._log.append(line)
            if READY_LINE in line:
                self._ready = True
                self._told.set()
        self._told.set()

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        if not self._told.wait(timeout_s):
            raise RuntimeError(f"the daemon was not ready within {timeout_s:g}s")
        if not self._ready:
            tail = "".join(self._log)
            raise RuntimeError(f"the daemon exited before it was ready:\n{tail}")

    def rss_bytes(self) -> int | None:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=10)  # reads to the end of the log, then the pipe closes
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def run_control_bench(sessions: int, samples: int = 500, seed: int = 0) -> int:
    """Run the bench and print its table; 1 if an operation failed."""
    if sessions < 1 or samples < 1:
        raise SystemExit("agentpark bench control: --sessions and --samples must be >= 1")
    samples = min(samples, sessions)
    state_dir = Path(tempfile.mkdtemp(prefix="agentpark-bench-control-"))
    daemon = _Daemon(state_dir, blocks=samples + 64)
    try:
        daemon.wait_ready()
        result = _measure(daemon, sessions, samples, random.Random(seed))
    except (RuntimeError, AgentparkAPIError) as exc:
        Console(stderr=True).print(f"agentpark bench control: {exc}")
        return 1
    finally:
        daemon.stop()
        shutil.rmtree(state_dir, ignore_errors=True)
    _print(result)
    return 0


class WireClient:
    """One keep-alive HTTP/1.1 connection through the standard library's ``http.client``
    and nothing more: the bench's timing client, so what it times is the daemon, its HTTP
    server and the loopback round trip, not a client library's own work. The routes come
    from agentpark.client_calls (the same paths, queries and bodies agentpark.client sends)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(
            parts.hostname or "127.0.0.1", parts.port, timeout=60
        )

    def send(self, call: calls._Call[Any]) -> tuple[Any, float | None]:
        """The answer's JSON and its Server-Timing ``app`` ms; RuntimeError for a non-2xx."""
        path = call.path + (f"?{urlencode(call.params)}" if call.params else "")
        body = None if call.json is None else json.dumps(call.json).encode()
        headers = {} if body is None else {"Content-Type": "application/json"}
        self.conn.request(call.method, path, body=body, headers=headers)
        response = self.conn.getresponse()
        data = response.read()
        if not 200 <= response.status < 300:
            raise RuntimeError(f"{call.method} {call.path}: {response.status} {data[:200]!r}")
        return (json.loads(data) if data else None), app_ms(response.getheader(SERVER_TIMING))

    def close(self) -> None:
        self.conn.close()


def _measure(daemon: _Daemon, sessions: int, samples: int, rng: random.Random) -> ControlResult:
    result = ControlResult(sessions, samples)
    ids = [f"s{i:06d}" for i in range(sessions)]
    one_block = rng.sample(ids, samples)
    pages = max(1, sessions // 100)
    bar = progress_bar(Console(stderr=True), auto_refresh=False)  # drawn between requests
    answered: list[float | None] = [None]  # agentpark.client's last Server-Timing, in ms

    def note_timing(response: httpx.Response) -> None:
        answered[0] = app_ms(response.headers.get(SERVER_TIMING))

    wire = WireClient(daemon.url)
    client = AgentparkClient(daemon.url, timeout=60.0, on_response=note_timing)
    with client, bar:

        def phase(name: str, n: int, step: Callable[[int], float | None], op: str | None) -> None:
            """``step(i)`` n times, each timed (``op``: its name in the result), the bar
            drawn between them; ``step`` returns the daemon's ms, if it said."""
            task = bar.add_task(name, total=n)
            every = max(1, n // 100)
            gc.collect()  # the bench's own garbage, collected outside the timed requests
            for i in range(n):
                started = time.perf_counter()
                own = step(i)
                elapsed = time.perf_counter() - started
                if op is not None:
                    result.add(op, elapsed, own)
                bar.advance(task)
                if i % every == 0:
                    bar.refresh()

        def by_wire(call: Callable[[int], calls._Call[Any]], check: Check = None) -> Step:
            def step(i: int) -> float | None:
                answer, own = wire.send(call(i))
                if check is not None:
                    check(answer)
                return own

            return step

        def by_client(call: Callable[[int], object]) -> Step:
            def step(i: int) -> float | None:
                answered[0] = None
                call(i)
                return answered[0]

            return step

        phase("create", sessions, by_wire(lambda i: calls._create_session(ids[i])), "create")
        result.rss_bytes = daemon.rss_bytes()
        phase(
            "one block each",
            samples,
            by_client(
                lambda i: client.generate(one_block[i], prompt_tokens=[1, 2, 3], max_new_tokens=1)
            ),
            None,
        )
        reads: dict[str, tuple[Callable[[int], calls._Call[Any]], Callable[[int], object]]] = {
            "get": (
                lambda _i: calls._get_session(rng.choice(ids)),
                lambda _i: client.get_session(rng.choice(ids)),
            ),
            "list": (
                lambda _i: calls._list_sessions(limit=100, cursor=str(rng.randrange(pages) * 100)),
                lambda _i: client.list_sessions(limit=100, cursor=str(rng.randrange(pages) * 100)),
            ),
            "host": (lambda _i: calls._host(), lambda _i: client.host()),
        }
        for op, (wire_call, client_call) in reads.items():
            phase(op, samples, by_wire(wire_call), op)
            phase(f"{op} (agentpark.client)", samples, by_client(client_call), f"{op} client")
        pause = by_wire(lambda i: calls._pause(one_block[i], tier="dram", force=True), _parked)
        phase("pause", samples, pause, "pause")
        phase(
            "resume", samples, by_wire(lambda i: calls._resume(one_block[i]), _restored), "resume"
        )
        phase(
            "pause (agentpark.client)",
            samples,
            by_client(lambda i: _park(client, one_block[i])),
            "pause client",
        )
        phase(
            "resume (agentpark.client)",
            samples,
            by_client(lambda i: _restore(client, one_block[i])),
            "resume client",
        )
        phase(
            "create (agentpark.client)",
            samples,
            by_client(lambda i: client.create_session(f"c{i:06d}")),
            "create client",
        )
    wire.close()
    return result


Check = Callable[[Any], None] | None
Step = Callable[[int], float | None]


def _parked(answer: Any) -> None:
    if answer["state"] != "parked" or answer["kv_bytes"] <= 0:
        raise RuntimeError(f"a pause left {answer['session_id']} {answer['state']}")


def _restored(answer: Any) -> None:
    if answer["restored_from"] != "dram":
        raise RuntimeError(
            f"a resume of {answer['session_id']} came from {answer['restored_from']}"
        )


def _park(client: AgentparkClient, session_id: str) -> None:
    paused = client.pause(session_id, tier="dram", force=True)
    if paused.state != "parked" or paused.kv_bytes <= 0:
        raise RuntimeError(f"pause of {session_id} left it {paused.state} ({paused.kv_bytes} B)")


def _restore(client: AgentparkClient, session_id: str) -> None:
    resumed = client.resume(session_id)
    if resumed.restored_from != "dram":
        raise RuntimeError(f"resume of {session_id} came from {resumed.restored_from}")


def _print(result: ControlResult) -> None:
    out = stdout_console()
    table = Table(
        title=f"agentpark bench control: {result.sessions} sessions, sequential HTTP "
        f"({result.samples} samples per operation)"
    )
    columns = ["operation", "n", "p50 ms", "p99 ms", "max ms", "client p50", "client p99"]
    columns += ["daemon p50", "daemon p99", "target", "met"]
    for column in columns:
        table.add_column(column, justify="left" if column == "operation" else "right")
    for op in ("create", "get", "list", "host", "pause", "resume"):
        values = result.times_ms[op]
        p50, p99 = result.quantile(op, 0.5) or 0.0, result.quantile(op, 0.99) or 0.0
        lib = [result.quantile(f"{op} client", q) for q in (0.5, 0.99)]
        own = [result.quantile(op, q, daemon=True) for q in (0.5, 0.99)]
        target = TARGETS_MS.get(op)
        if target is None:
            goal, met = "", ""
        else:
            which, limit = target
            goal = f"{which} < {limit:g} ms"
            met = "yes" if (p50 if which == "p50" else p99) < limit else "NO"
        table.add_row(
            op,
            str(len(values)),
            f"{p50:.2f}",
            f"{p99:.2f}",
            f"{max(values):.2f}",
            *("-" if v is None else f"{v:.2f}" for v in (*lib, *own)),
            goal,
            met,
        )
    out.print(table)
    rss = result.rss_bytes
    out.print(
        f"daemon RSS after creating the sessions: {rss / 2**20:.0f} MiB"
        if rss is not None
        else "daemon RSS: unknown (no /proc)"
    )
    out.print(
        "times (judged): one request at a time over one keep-alive loopback connection, "
        "with a minimal HTTP/1.1 client (the standard library's http.client: the daemon, "
        "its HTTP server and loopback, little else); client: the same operations through "
        "agentpark.client (httpx and the answer's pydantic model) in the same run, on other "
        "samples (create: "
        f"{len(result.times_ms.get('create client', []))} more sessions); daemon: its "
        "Server-Timing for the timed requests, from the request reaching the app to the "
        "answer starting",
        soft_wrap=True,
    )
