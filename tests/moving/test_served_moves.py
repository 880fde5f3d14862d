"""Moves between two ``agentpark serve`` processes on loopback (tests.moving.served): the
move restored bit-exact on B and gone from A, a move cut mid-stream and picked up, and a
drain of 100 sessions with both daemons restarted afterwards."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from agentpark.cli.entry import main
from tests.harness import DaemonProcess
from tests.moving.proxy import CuttingProxy
from tests.moving.served import park, served_pair

Starter = Callable[[Path, int], DaemonProcess]
STEP = {"max_new_tokens": 12, "return_logits": True}
BLOCK = 4096  # the tiny model's block: 2 layers x K,V x 16 tokens x 2 heads x 16 x bfloat16
LONG_PROMPT = "a long agent context, " * 8  # 176 tokens + 20 generated: 13 blocks


def _events(daemon: DaemonProcess, session_id: str) -> list[dict[str, object]]:
    answer = daemon.client.get("/v1/events", params={"session_id": session_id})
    events: list[dict[str, object]] = answer.json()["events"]
    return events


def test_a_session_moved_between_processes_restores_bit_exact_on_b_and_is_gone_from_a(
    tmp_path: Path, shm_dir: Path, daemon_process: Starter
) -> None:
    pair = served_pair(tmp_path, shm_dir, daemon_process)
    a, b = pair.a, pair.b
    prompt = "an agent that waits on a long tool call"
    park(a, "agent-1", prompt)
    park(a, "twin", prompt)  # stays on A: what agent-1 would have decoded, had it not moved
    before = a.client.get("/v1/sessions/agent-1").json()
    reference = a.client.post("/v1/sessions/twin/generate", json=STEP).json()

    moved = pair.move("agent-1")
    assert moved.status_code == 200, moved.text
    result = moved.json()
    assert result["blocks"] == before["kv_blocks"] == result["blocks_sent"]
    assert result["bytes_sent"] == result["blocks"] * BLOCK
    assert result["data_port"] is True  # B's data port: loopback, on by default

    on_b = b.client.get("/v1/sessions/agent-1").json()
    assert on_b["state"] == "parked" and on_b["tier"] == "shm"
    for key in ("num_tokens", "kv_blocks", "kv_bytes", "tool", "pause_count", "metadata"):
        assert on_b[key] == before[key], key
    # Restored from B's shm copy, it decodes bit for bit what the twin decoded on A.
    out = b.client.post("/v1/sessions/agent-1/generate", json=STEP).json()
    assert out["resumed"] is True and out["restored_from"] == "shm"
    assert out["tokens"] == reference["tokens"]
    assert out["logits"] == reference["logits"]

    assert a.client.get("/v1/sessions/agent-1").status_code == 404
    moved_out = _events(a, "agent-1")[0]
    assert moved_out["kind"] == "moved_out"
    assert moved_out["detail"] == f"to={b.url} move={result['move_id']}"
    assert "moved_in" in [e["kind"] for e in _events(b, "agent-1")]


def test_a_move_between_processes_cut_mid_stream_is_picked_up_and_sends_each_block_once(
    tmp_path: Path, shm_dir: Path, daemon_process: Starter
) -> None:
    # B takes one block per request: the cut lands between two of them.
    # In HTTP chunks (the fallback path; the data port's cut: test_data_port.py).
    one_block = {"limits": {"max_body_bytes": 4096 + BLOCK}, "moves": {"data": "off"}}
    pair = served_pair(tmp_path, shm_dir, daemon_process, b_overrides=one_block)
    park(pair.a, "long", LONG_PROMPT)
    blocks = pair.a.client.get("/v1/sessions/long").json()["kv_blocks"]
    assert blocks >= 10
    reference = pair.a.client.get("/v1/sessions/long").json()
    port = int(pair.b.url.rsplit(":", 1)[1])
    with CuttingProxy(port, cut_after=8192 + 5 * BLOCK) as proxy:
        # The link drops mid-stream and stays down: the move gives up, A keeps the session.
        proxy.refuse_after_cut = True
        first = pair.move("long", to=proxy.url)
        assert first.status_code == 502, first.text
        assert proxy.cuts == 1
        details = first.json()["error"]["details"]
        assert details["in_doubt"] is False
        assert pair.a.client.get("/v1/sessions/long").json()["state"] == "parked"
        assert pair.b.client.get("/v1/sessions/long").status_code == 404

        # The link is back: the same move goes on with what B lacks, nothing twice.
        proxy.refuse = False
        second = pair.move("long", to=proxy.url)
        assert second.status_code == 200, second.text
        result = second.json()
        assert result["move_id"] == details["move_id"] and result["resumed"] is True
        assert 0 < result["blocks_sent"] < blocks  # what B verified before the cut stayed
    moved_in = [e for e in _events(pair.b, "long") if e["kind"] == "moved_in"]
    assert len(moved_in) == 1 and moved_in[0]["bytes"] == blocks * BLOCK  # each block once
    assert pair.a.client.get("/v1/sessions/long").status_code == 404
    on_b = pair.b.client.get("/v1/sessions/long").json()
    assert on_b["state"] == "parked" and on_b["num_tokens"] == reference["num_tokens"]
    assert pair.b.client.post("/v1/sessions/long/resume").json()["restored_from"] == "shm"


N = 100
ROOM = {"tiers": {"shm": {"capacity": 256 * BLOCK}}}


def _sessions(daemon: DaemonProcess) -> dict[str, str]:
    """Every live session of the daemon (all pages): id -> state."""
    found: dict[str, str] = {}
    params: dict[str, str | int] = {"limit": 500}
    while True:
        page = daemon.client.get("/v1/sessions", params=params).json()
        found.update({s["session_id"]: s["state"] for s in page["sessions"]})
        if not page.get("next_cursor"):
            return found
        params["cursor"] = page["next_cursor"]


def test_drain_of_100_sessions_between_processes_then_both_restarted_each_once_on_b(
    tmp_path: Path,
    shm_dir: Path,
    daemon_process: Starter,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pair = served_pair(tmp_path, shm_dir, daemon_process, ROOM, ROOM)
    c = pair.a.client
    for i in range(N):
        sid = f"agent-{i:03d}"
        assert c.post("/v1/sessions", json={"session_id": sid}).status_code == 201
        c.post(f"/v1/sessions/{sid}/generate", json={"prompt": f"agent {i}", "max_new_tokens": 4})
        assert c.post(f"/v1/sessions/{sid}/pause", json={"tier": "shm"}).json()["state"] == "parked"
    c.post("/v1/sessions", json={"session_id": "stays-active"})  # not parked: stays on A

    source = ["--url", pair.a.url, "--token", pair.tokens["a"]]
    code = main(["drain", *source, "--to", pair.b.url, "--to-token", pair.tokens["b"]])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"{N} moved" in out and "1 not parked" in out

    for daemon in (pair.a, pair.b):  # uvicorn ends on SIGTERM by raising it again
        assert daemon.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    a, b = pair.serve("a"), pair.serve("b")
    on_a, on_b = _sessions(a), _sessions(b)
    assert on_a == {"stays-active": "active"}
    assert sorted(on_b) == [f"agent-{i:03d}" for i in range(N)]
    assert set(on_b.values()) == {"parked"}  # re-attached from B's shm tier
    assert b.client.post("/v1/sessions/agent-042/resume").json()["restored_from"] == "shm"
    assert a.client.get("/v1/sessions/agent-042").status_code == 404
