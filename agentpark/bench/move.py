"""``agentpark bench move``: parked sessions handed between two daemons on this machine.

Two real daemons (``agentpark serve`` child processes on loopback, agentpark.bench.served),
each with its own config, state dir, /dev/shm tier and admin token made with the CLI (two
daemons in threads of one process share its GIL: that measured contention, not the move).
After one untimed warm-up drain as large as a run (B's tier, sized for one run, is then
written once through, as a daemon up a while has it), each run parks ``sessions``
sessions of ``tokens`` random tokens on A, then drains them to B (``POST
/v1/moves/drain``: one batch begin, every block sent from A's tier over B's data port
and verified against its digest as it lands in B's tier, then the commit asked at the end
of that connection, one SQLite transaction on B, and one drop on A, one more). In the
same run a plain loopback TCP copy moves the same number of bytes between preallocated
buffers (the floor any move over a socket pays; the median of three copies). Printed per
run and as medians: the move's bytes per second, the socket's, their ratio (taken within
one run), and the time the drained host took to hand over all its sessions; then the load
average, since this machine is shared.

The sessions' KV layout (``--kv``, :data:`KV_LAYOUTS`) is what sets the bytes a session
carries: by default that of Llama-3-8B and Mistral-7B (32 layers of 8 KV heads of 128:
128 KiB a token, 2 MiB a 16-token block), under a small compute (a narrow model body, so
a CPU prefills it in seconds). ``small`` is the 16x smaller KV of earlier runs (128 KiB a
block): its 16 MiB sessions of 2048 tokens measure each session's bookkeeping on both
daemons more than bytes per second.
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.table import Table

from agentpark.bench.common import MiB, stdout_console
from agentpark.bench.served import ServedDaemon, toml_config
from agentpark.config import load_settings

__all__ = ["BENCH_MODEL", "KV_LAYOUTS", "MoveRun", "run_move_bench", "socket_copy_s"]

KV_LAYOUTS: dict[str, dict[str, int]] = {
    # Llama-3-8B's and Mistral-7B's KV (32 x 8 x 128, bfloat16) on a narrow body.
    "llama3-8b": {
        "d_model": 256,
        "n_layers": 32,
        "n_heads": 8,
        "n_kv_heads": 8,
        "head_dim": 128,
        "ffn_dim": 512,
    },
    # The KV the bench used before 2026-12-03 17:40 UTC: 128 KiB a 16-token block.
    "small": {
        "d_model": 256,
        "n_layers": 8,
        "n_heads": 8,
        "n_kv_heads": 8,
        "head_dim": 32,
        "ffn_dim": 512,
    },
}
"""Models by the KV layout their sessions carry; each prefills 1024 tokens in seconds here."""
BENCH_MODEL = KV_LAYOUTS["llama3-8b"]
"""The default: a real 8B model's KV per token (128 KiB), so a session's bytes are real."""
TARGET_RATIO = 0.8
SOCKET_COPIES = 3


@dataclass
class MoveRun:
    sessions: int
    nbytes: int
    drain_s: float
    socket_s: float

    @property
    def move_bps(self) -> float:
        return self.nbytes / self.drain_s

    @property
    def socket_bps(self) -> float:
        return self.nbytes / self.socket_s

    @property
    def ratio(self) -> float:
        return self.move_bps / self.socket_bps


def socket_copy_s(nbytes: int, chunk: int) -> float:
    """Seconds to send ``nbytes`` over a loopback TCP connection, ``chunk`` bytes per
    send, from one preallocated buffer into another (a reader thread)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    src = b"\x01" * chunk
    dst = bytearray(chunk)
    done = threading.Event()

    def read() -> None:
        conn, _ = listener.accept()
        with conn:
            view, got = memoryview(dst), 0
            while got < nbytes:
                n = conn.recv_into(view, min(chunk, nbytes - got))
                if n == 0:
                    break
                got += n
            conn.sendall(b"k")
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        started = time.perf_counter()
        sent = 0
        while sent < nbytes:
            n = min(chunk, nbytes - sent)
            conn.sendall(memoryview(src)[:n])
            sent += n
        conn.recv(1)
        elapsed = time.perf_counter() - started
    reader.join(timeout=60)
    listener.close()
    return elapsed


def _config(
    root: Path,
    name: str,
    tokens: int,
    sessions: int,
    model: dict[str, int],
    geometry: tuple[int, int],
    room: int,
) -> Path:
    """A daemon's config; its shm tier holds ``room`` runs' sessions (``geometry``: the
    blocks a session takes and the bytes of each, from :func:`_geometry`)."""
    blocks, block_bytes = geometry
    return toml_config(
        root / f"{name}.toml",
        {
            "state_dir": str(root / name),
            "log_level": "warning",
            "model": {**model, "max_seq_len": tokens + 32},
            "pool": {"num_blocks": 2 * blocks + 8},
            "tiers": {
                "dram": {"capacity": 0},
                "shm": {
                    "capacity": room * sessions * blocks * block_bytes,
                    "path": str(root / f"{name}.shm"),
                },
            },
            "policy": {"idle_pause_after_s": 0},
            "limits": {"max_body_bytes": 16 * MiB},
            "shutdown": {"drain": False},
        },
    )


def _geometry(model: dict[str, int], tokens: int) -> tuple[int, int]:
    """Blocks a session of ``tokens`` takes (one spare), and the bytes of each block."""
    probe = load_settings(None, model={**model, "max_seq_len": tokens + 32})
    block_size = probe.pool.block_size
    block_bytes = 2 * model["n_layers"] * block_size * model["n_kv_heads"]
    block_bytes *= model["head_dim"] * 2  # bfloat16
    return -(-tokens // block_size) + 1, block_bytes


def _park(client: httpx.Client, session_id: str, tokens: int, rng: np.random.Generator) -> None:
    client.post("/v1/sessions", json={"session_id": session_id}).raise_for_status()
    prompt = rng.integers(0, 256, tokens - 1).tolist()
    body = {"prompt_tokens": prompt, "max_new_tokens": 1}
    client.post(f"/v1/sessions/{session_id}/generate", json=body).raise_for_status()
    paused = client.post(f"/v1/sessions/{session_id}/pause", json={"tier": "shm"})
    paused.raise_for_status()
    if paused.json()["state"] != "parked":
        raise RuntimeError(f"{session_id} did not park: {paused.text}")


def run_move_bench(
    sessions: int = 8,
    tokens: int = 1024,
    repeats: int = 3,
    model: dict[str, int] | None = None,
    seed: int = 0,
) -> list[MoveRun]:
    """Run it and print the table; returns the runs (the unit test reads them)."""
    model = model or BENCH_MODEL
    console = stdout_console()
    rng = np.random.default_rng(seed)
    geometry = _geometry(model, tokens)
    root = Path(tempfile.mkdtemp(prefix="agentpark-bench-move-", dir="/dev/shm"))
    daemons: list[ServedDaemon] = []
    runs: list[MoveRun] = []
    try:
        a = ServedDaemon(_config(root, "a", tokens, sessions, model, geometry, 2))
        daemons.append(a)
        # B's tier holds one run: the warm-up writes every page of it once, so the timed
        # runs write into memory the kernel has mapped already, as a daemon that has been
        # up a while does (and as the socket copy's preallocated buffer is); a fresh tier
        # pays a page fault per 4 KiB page on its first write.
        b = ServedDaemon(_config(root, "b", tokens, sessions, model, geometry, 1))
        daemons.append(b)
        a_token, b_token = a.token, b.token
        with (
            httpx.Client(base_url=a.url, timeout=600, headers=_bearer(a_token)) as on_a,
            httpx.Client(base_url=b.url, timeout=600, headers=_bearer(b_token)) as on_b,
        ):
            # A first drain, not timed, as large as a run: connections, the target's first
            # imports, SQLite's first writes of the moves table (the first run was 4x
            # slower without it), B's tier pages touched once.
            _one_run(-1, on_a, on_b, b.url, b_token, sessions, tokens, rng)
            for run in range(repeats):
                runs.append(_one_run(run, on_a, on_b, b.url, b_token, sessions, tokens, rng))
    finally:
        for daemon in reversed(daemons):
            daemon.stop()

        shutil.rmtree(root, ignore_errors=True)
    _print(console, runs, sessions, tokens, geometry[1])
    return runs


def _one_run(
    run: int,
    on_a: httpx.Client,
    on_b: httpx.Client,
    b_url: str,
    b_token: str,
    sessions: int,
    tokens: int,
    rng: np.random.Generator,
) -> MoveRun:
    ids = [f"run{run}-s{i}" for i in range(sessions)]
    for sid in ids:
        _park(on_a, sid, tokens, rng)
    started = time.perf_counter()
    answer = on_a.post("/v1/moves/drain", json={"to": b_url, "to_token": b_token})
    drain_s = time.perf_counter() - started
    answer.raise_for_status()
    out: dict[str, Any] = answer.json()
    if out["moved"] != sessions or out["failed"]:
        raise RuntimeError(f"drain moved {out['moved']} of {sessions}: {out['failed']}")
    nbytes = int(out["bytes_sent"])
    # The reference's own noise on this machine is large (one copy: 2.0-3.6 GB/s in one
    # bench run): the median of a few copies, taken right after the drain.
    socket_s = statistics.median(socket_copy_s(nbytes, 16 * MiB) for _ in range(SOCKET_COPIES))
    for sid in ids:  # B's room for the next run
        on_b.delete(f"/v1/sessions/{sid}").raise_for_status()
    return MoveRun(sessions, nbytes, drain_s, socket_s)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _print(console: Any, runs: list[MoveRun], sessions: int, tokens: int, block: int) -> None:
    title = f"move: {sessions} parked sessions of {tokens} tokens ({block // 1024} KiB a block)"
    table = Table(title=f"{title}, A -> B (drain)")
    for column in ("run", "MiB", "move MB/s", "socket MB/s", "ratio", "drain s", "per session ms"):
        table.add_column(column, justify="right")
    for i, r in enumerate(runs):
        table.add_row(
            str(i),
            f"{r.nbytes / MiB:.1f}",
            f"{r.move_bps / 1e6:.0f}",
            f"{r.socket_bps / 1e6:.0f}",
            f"{r.ratio:.2f}",
            f"{r.drain_s:.3f}",
            f"{r.drain_s * 1e3 / r.sessions:.1f}",
        )
    med = statistics.median
    table.add_row(
        "median",
        f"{med(r.nbytes for r in runs) / MiB:.1f}",
        f"{med(r.move_bps for r in runs) / 1e6:.0f}",
        f"{med(r.socket_bps for r in runs) / 1e6:.0f}",
        f"{med(r.ratio for r in runs):.2f}",
        f"{med(r.drain_s for r in runs):.3f}",
        f"{med(r.drain_s * 1e3 / r.sessions for r in runs):.1f}",
    )
    console.print(table)
    ratio = med(r.ratio for r in runs)
    verdict = "meets" if ratio >= TARGET_RATIO else "misses"
    console.print(f"median ratio {ratio:.2f} {verdict} the target of {TARGET_RATIO}x a socket copy")
    load = os.getloadavg()
    console.print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cpus)")
