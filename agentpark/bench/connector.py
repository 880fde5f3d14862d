"""``agentpark bench connector-control``: the vLLM connector's control calls, p50/p99.

A real daemon in vLLM mode (``agentpark serve`` in a child process: its own SQLite file
and a private /dev/shm pool, removed afterwards) serves this process, which plays the
connector: the same :class:`~agentpark.connectors.client.ControlClient` and frames that
vLLM's scheduler and worker use. It registers a layout (block 128 tokens), parks
``--sessions`` sessions of ``--tokens`` tokens, then times, one call at a time:

- ``match``: the scheduler's question on every new request of a session (read only);
- ``prepare_store`` + ``complete_store``: a turn end that parks (two calls, SQLite writes);
- ``begin_load`` + ``load_done``: a restore (two calls, SQLite writes).

Target (issue 9): p99 under 1 ms at 1,000 sessions for the scheduler-path call (match).
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from agentpark.bench.common import stdout_console
from agentpark.connectors.client import ControlClient
from agentpark.connectors.protocol import Layout, encode_tokens

__all__ = ["run_connector_bench"]

READY_LINE = "serving vLLM connectors"
BLOCK = 128
LAYOUT = Layout("bench:tiny", BLOCK, 4096, (((1, BLOCK, 8), "uint16"),), "torch.bfloat16")
TARGET_P99_MS = 1.0


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_connector_bench(sessions: int = 1000, samples: int = 2000, tokens: int = 2048) -> int:
    work = Path(tempfile.mkdtemp(prefix="agentpark-bench-connector-"))
    shm = Path(tempfile.mkdtemp(prefix="agentpark-bench-connector-", dir="/dev/shm"))
    blocks = tokens // BLOCK
    pool_bytes = max(64 << 20, (sessions + 8) * blocks * 2 * BLOCK * 8 + (8 << 20))
    config = work / "agentpark.toml"
    config.write_text(
        f'state_dir = "{work / "state"}"\nlog_level = "info"\n[server]\nport = 0\n'
        f'[vllm]\nenabled = true\npool_capacity = {pool_bytes}\npool_path = "{shm / "pool"}"\n'
        "[policy]\nidle_pause_after_s = 0\n"
        '[integrity]\nchecksum = "none"\n'  # the bench's worker copies no bytes to hash
    )
    cmd = [sys.executable, "-m", "agentpark", "serve", "--config", str(config)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    ready = threading.Event()
    url: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "Uvicorn running on" in line:
                url.append(line.split("running on ")[1].split()[0])
            if READY_LINE in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not ready.wait(120):
            print("agentpark: the daemon did not become ready", file=sys.stderr)
            return 1
        while not url:  # uvicorn's line comes right after the runtime's
            reader.join(0.01)
        with urllib.request.urlopen(f"{url[0]}/v1/vllm", timeout=5) as response:
            path = json.loads(response.read())["control_socket"]
        client = ControlClient(None, socket_path=path, timeout_s=5.0, who="bench")
        times = _measure(client, sessions, samples, blocks, random.Random(0))
        _print(times, sessions, tokens)
        ok = _quantile(times["match"], 0.99) < TARGET_P99_MS
        client.close()
        return 0 if ok else 1
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        if proc.stderr is not None:
            proc.stderr.close()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)


def _call(client: ControlClient, op: str, blob: bytes = b"", **fields: Any) -> dict[str, Any]:
    answer = client.call(op, blob, **fields)
    if answer is None or not answer.get("ok"):
        raise SystemExit(f"agentpark bench: {op} failed: {answer}")
    return answer


def _measure(
    client: ControlClient, sessions: int, samples: int, blocks: int, rng: random.Random
) -> dict[str, list[float]]:
    _call(client, "register", wait_s=60.0, layout=LAYOUT.to_wire())
    prompts: dict[str, list[int]] = {}
    times: dict[str, list[float]] = {"match": [], "park": [], "restore": []}

    def park(sid: str) -> float:
        tokens = prompts[sid]
        start = time.perf_counter()
        plan = _call(
            client,
            "prepare_store",
            encode_tokens(tokens),
            tenant="default",
            session_id=sid,
            block_ids=list(range(blocks)),
            tool="bench",
            expected_resume_s=60.0,
        )
        _call(client, "complete_store", store_id=plan["store_id"], ok=True, checksum=None)
        return time.perf_counter() - start

    for i in range(sessions):
        sid = f"agent-{i}"
        prompts[sid] = [rng.randrange(50_000) for _ in range(blocks * BLOCK)]
        park(sid)
    names = list(prompts)

    def timed(op: str, step: Callable[[str], float | None]) -> None:
        for _ in range(samples):
            sid = rng.choice(names)
            start = time.perf_counter()
            took = step(sid)
            times[op].append((took if took is not None else time.perf_counter() - start) * 1e3)

    def match(sid: str) -> None:
        _call(
            client,
            "match",
            encode_tokens([*prompts[sid], 1, 2, 3]),
            tenant="default",
            session_id=sid,
            num_computed=0,
        )

    def restore(sid: str) -> float:
        tokens = [*prompts[sid], 1]
        start = time.perf_counter()
        load = _call(
            client,
            "begin_load",
            encode_tokens(tokens),
            tenant="default",
            session_id=sid,
            start_block=0,
            block_ids=list(range(blocks)),
        )
        _call(client, "load_done", load_id=load["load_id"], ok=True)
        took = time.perf_counter() - start
        park(sid)  # park it again for the next sample (not timed)
        return took

    timed("match", match)
    timed("restore", restore)
    timed("park", lambda sid: _repark(sid, park, client, prompts, blocks))
    return times


def _repark(
    sid: str,
    park: Callable[[str], float],
    client: ControlClient,
    prompts: dict[str, list[int]],
    blocks: int,
) -> float:
    # A parked session's next turn ends: restore it (untimed), then time the park.
    load = _call(
        client,
        "begin_load",
        encode_tokens([*prompts[sid], 1]),
        tenant="default",
        session_id=sid,
        start_block=0,
        block_ids=list(range(blocks)),
    )
    _call(client, "load_done", load_id=load["load_id"], ok=True)
    return park(sid)


def _print(times: dict[str, list[float]], sessions: int, tokens: int) -> None:
    out = stdout_console()
    table = Table(title=f"connector control calls, {sessions} parked sessions of {tokens} tokens")
    for column in ("call", "samples", "p50 ms", "p99 ms", "target"):
        table.add_column(column)
    labels = {
        "match": ("match (scheduler, every new request)", f"p99 < {TARGET_P99_MS} ms"),
        "park": ("prepare_store + complete_store", ""),
        "restore": ("begin_load + load_done", ""),
    }
    for op, values in times.items():
        label, target = labels[op]
        table.add_row(
            label,
            str(len(values)),
            f"{statistics.median(values):.3f}",
            f"{_quantile(values, 0.99):.3f}",
            target,
        )
    out.print(table)
