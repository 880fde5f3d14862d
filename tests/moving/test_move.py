"""A parked session moved between two real daemons on loopback (A -> B)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agentpark.config import Settings
from tests.harness import Daemon
from tests.moving.pair import make_pair, park_session, parked_bytes
from tests.moving.proxy import CuttingProxy

STEP = {"max_new_tokens": 12, "return_logits": True}


def test_a_moved_session_restores_on_b_bit_exact_and_is_gone_from_a(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    pair = make_pair(tmp_path, shm_dir, daemon_factory)
    a, b = pair.a, pair.b
    prompt = "an agent that waits on a long tool call"
    park_session(a, "agent-1", prompt)
    kv_on_a = parked_bytes(a, "agent-1")
    before = a.client.get("/v1/sessions/agent-1").json()
    # Its twin stays on A: what the session would have decoded next, had it not moved.
    park_session(a, "twin", prompt)
    assert parked_bytes(a, "twin") == kv_on_a
    reference = a.client.post("/v1/sessions/twin/generate", json=STEP).json()

    moved = pair.move("agent-1")
    assert moved.status_code == 200, moved.text
    result = moved.json()
    assert result["blocks"] == before["kv_blocks"] == result["blocks_sent"]
    assert result["blocks_held"] == 0 and result["resumed"] is False

    # On B: parked, same record, same bytes, and it decodes what A would have.
    on_b = b.client.get("/v1/sessions/agent-1").json()
    assert on_b["state"] == "parked" and on_b["tier"] == "shm"
    for field in ("num_tokens", "kv_blocks", "kv_bytes", "tool", "pause_count", "metadata"):
        assert on_b[field] == before[field], field
    assert parked_bytes(b, "agent-1") == kv_on_a
    out = b.client.post("/v1/sessions/agent-1/generate", json=STEP).json()
    assert out["resumed"] is True and out["restored_from"] == "shm"
    assert out["tokens"] == reference["tokens"]
    assert out["logits"] == reference["logits"]

    # Gone from A like a delete, with an event naming B; its slots are free again.
    assert a.client.get("/v1/sessions/agent-1").status_code == 404
    events = a.client.get("/v1/events", params={"session_id": "agent-1"}).json()["events"]
    assert events[0]["kind"] == "moved_out"
    assert events[0]["detail"] == f"to={b.url} move={result['move_id']}"
    a.runtime.parking.check_invariants()
    b.runtime.parking.check_invariants()
    assert a.runtime.parking.tiers["shm"].used_blocks == 0  # the twin is active again
    kinds = [
        e["kind"]
        for e in b.client.get("/v1/events", params={"session_id": "agent-1"}).json()["events"]
    ]
    assert "moved_in" in kinds


def test_a_second_session_with_the_same_prefix_sends_only_what_b_lacks(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    pair = make_pair(tmp_path, shm_dir, daemon_factory)
    prompt = "a shared system prompt that fills two whole blocks of sixteen tokens each"
    park_session(pair.a, "first", prompt)
    assert pair.move("first").status_code == 200
    # The same prompt on B already: its full blocks are there by content.
    a = pair.a.client
    a.post("/v1/sessions", json={"session_id": "second"})
    a.post("/v1/sessions/second/generate", json={"prompt": prompt, "max_new_tokens": 3})
    a.post("/v1/sessions/second/pause", json={"tier": "shm"})
    result = pair.move("second").json()
    assert result["blocks_held"] >= 2
    assert result["blocks_sent"] == result["blocks"] - result["blocks_held"]
    assert pair.b.client.get("/v1/sessions/second").json()["state"] == "parked"
    pair.b.runtime.parking.check_invariants()


LONG_PROMPT = "a long agent context, " * 8  # 176 tokens + 20 generated: 13 blocks


def test_a_move_cut_mid_stream_is_picked_up_and_sends_each_block_once(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    pair = make_pair(tmp_path, shm_dir, daemon_factory)
    park_session(pair.a, "long", LONG_PROMPT)
    kv = parked_bytes(pair.a, "long")
    exporter = pair.a.app.state.moves.exporter
    importer = pair.b.app.state.moves.importer
    block = pair.a.runtime.parking.geometry.block_nbytes
    blocks = len(kv) // block
    assert blocks >= 10
    exporter.chunk_bytes = block  # a request per block: the cut lands inside one of them
    exporter.retries = 1
    port = int(pair.b.url.rsplit(":", 1)[1])
    with CuttingProxy(port, cut_after=8192 + 5 * block) as proxy:
        # The link drops mid-stream and stays down: the move gives up, A keeps the session.
        proxy.refuse_after_cut = True
        first = pair.move("long", to=proxy.url)
        assert first.status_code == 502, first.text
        assert proxy.cuts == 1
        details = first.json()["error"]["details"]
        move_id, landed = details["move_id"], importer.received(details["move_id"])
        assert details["in_doubt"] is False
        assert landed is not None and 0 < landed < blocks
        assert pair.a.client.get("/v1/sessions/long").json()["state"] == "parked"
        assert pair.b.client.get("/v1/sessions/long").status_code == 404

        # The link is back: the same move goes on with what B lacks, nothing twice.
        proxy.refuse = False
        second = pair.move("long", to=proxy.url)
        assert second.status_code == 200, second.text
        result = second.json()
        assert result["move_id"] == move_id and result["resumed"] is True
        assert result["blocks_sent"] == blocks - landed
    assert parked_bytes(pair.b, "long") == kv
    moved_in = [
        e
        for e in pair.b.client.get("/v1/events", params={"session_id": "long"}).json()["events"]
        if e["kind"] == "moved_in"
    ]
    assert len(moved_in) == 1 and moved_in[0]["bytes"] == blocks * block  # each block once
    assert pair.a.client.get("/v1/sessions/long").status_code == 404
    pair.b.runtime.parking.check_invariants()


def test_a_dropped_connection_is_picked_up_within_one_move(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    pair = make_pair(tmp_path, shm_dir, daemon_factory)
    park_session(pair.a, "long", LONG_PROMPT)
    kv = parked_bytes(pair.a, "long")
    block = pair.a.runtime.parking.geometry.block_nbytes
    pair.a.app.state.moves.exporter.chunk_bytes = 2 * block
    port = int(pair.b.url.rsplit(":", 1)[1])
    with CuttingProxy(port, cut_after=8192 + 3 * block) as proxy:
        moved = pair.move("long", to=proxy.url)
        assert moved.status_code == 200, moved.text
        assert proxy.cuts == 1 and moved.json()["retries"] >= 1
    assert parked_bytes(pair.b, "long") == kv


def test_a_move_picked_up_after_the_session_was_parked_again_sends_the_new_copy(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    pair = make_pair(tmp_path, shm_dir, daemon_factory)
    park_session(pair.a, "long", LONG_PROMPT)
    exporter = pair.a.app.state.moves.exporter
    block = pair.a.runtime.parking.geometry.block_nbytes
    exporter.chunk_bytes, exporter.retries = block, 0
    port = int(pair.b.url.rsplit(":", 1)[1])
    with CuttingProxy(port, cut_after=8192 + 4 * block) as proxy:
        proxy.refuse_after_cut = True
        assert pair.move("long", to=proxy.url).status_code == 502
        # The agent came back meanwhile and was parked again: another copy.
        c = pair.a.client
        c.post("/v1/sessions/long/generate", json={"prompt": " more", "max_new_tokens": 3})
        assert c.post("/v1/sessions/long/pause", json={"tier": "shm"}).status_code == 200
        kv = parked_bytes(pair.a, "long")
        proxy.refuse = False
        moved = pair.move("long", to=proxy.url)
        assert moved.status_code == 200, moved.text
    assert moved.json()["resumed"] is True
    assert parked_bytes(pair.b, "long") == kv
    pair.b.runtime.parking.check_invariants()
