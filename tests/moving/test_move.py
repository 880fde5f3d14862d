"""A parked session moved between two real daemons on loopback (A -> B), in threads of
the test process where a test reads either daemon's insides (test_served_moves.py runs
them as `agentpark serve` processes)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agentpark.config import Settings
from agentpark.moving.peer import Peer
from tests.harness import Daemon
from tests.moving.pair import cut_then_resumed, make_pair, park_session, parked_bytes
from tests.moving.proxy import CuttingProxy

STEP = {"max_new_tokens": 12, "return_logits": True}
HTTP_ONLY = {"moves": {"data": "off"}}  # blocks in HTTP chunks (the fallback): the proxy cuts them


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
    pair = make_pair(tmp_path, shm_dir, daemon_factory, HTTP_ONLY)
    park_session(pair.a, "long", LONG_PROMPT)
    kv = parked_bytes(pair.a, "long")
    exporter = pair.a.app.state.moves.exporter
    block = pair.a.runtime.parking.geometry.block_nbytes
    blocks = len(kv) // block
    assert blocks >= 10
    exporter.chunk_bytes = block  # a request per block: the cut lands inside one of them
    exporter.retries = 1
    port = int(pair.b.url.rsplit(":", 1)[1])
    with CuttingProxy(port, cut_after=8192 + 5 * block) as proxy:
        # The link drops mid-stream and stays down: the move gives up, A keeps the session.
        landed, result, _ = cut_then_resumed(pair, proxy, blocks, to=proxy.url)
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
    pair = make_pair(tmp_path, shm_dir, daemon_factory, HTTP_ONLY)
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
    pair = make_pair(tmp_path, shm_dir, daemon_factory, HTTP_ONLY)
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


def test_a_target_without_the_batch_routes_gets_each_session_on_its_own_routes(
    tmp_path: Path,
    shm_dir: Path,
    daemon_factory: Callable[[Settings], Daemon],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # B as a daemon from before the batch routes: what Peer.begin_batch makes of their 404.
    monkeypatch.setattr(Peer, "begin_batch", lambda self, manifests, data: None)
    pair = make_pair(tmp_path, shm_dir, daemon_factory)
    park_session(pair.a, "old", LONG_PROMPT)
    kv = parked_bytes(pair.a, "old")
    moved = pair.move("old")
    assert moved.status_code == 200, moved.text
    result = moved.json()
    assert result["resumed"] is False and result["retries"] == 0  # a first move, not a retry
    assert result["blocks_sent"] == result["blocks"] > 0
    assert parked_bytes(pair.b, "old") == kv
    assert pair.a.client.get("/v1/sessions/old").status_code == 404
    pair.b.runtime.parking.check_invariants()
