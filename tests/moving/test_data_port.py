"""Moves over the target's data port (agentpark.moving.dataport) between two daemons on
loopback: a batched drain restored bit-exact, a data connection cut and picked up, and
what the port refuses (tickets, excess, stalls, the connection cap, bad blocks)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from agentpark.config import Settings
from agentpark.moving.dataport import ACK, BAD_BLOCK, COMMIT, OK
from agentpark.moving.peer import Peer
from agentpark.moving.ticket import HELLO, TICKET_LEN
from agentpark.moving.wire import BatchBeginAnswer, BatchCommitAnswer, DataOffer
from agentpark.store.models import EventRow, SessionRow
from tests.harness import Daemon
from tests.moving.pair import Pair, cut_then_resumed, make_pair, park_session, parked_bytes
from tests.moving.proxy import CuttingProxy

ROOM = {"tiers": {"shm": {"capacity": 256 * 4096}}}
LONG_PROMPT = "a long agent context, " * 8  # 176 tokens + 20 generated: 13 blocks
Writes = list[Sequence[tuple[SessionRow, Sequence[EventRow], bool]]]


def _moves(daemon: Daemon) -> Any:
    return daemon.app.state.moves


def _count_writes(daemon: Daemon) -> Writes:
    """Every SessionStore.write_many of ``daemon`` (one per transaction), recorded."""
    store = daemon.runtime.parking.store
    calls: Writes = []
    real = store.write_many

    def write_many(items: Sequence[tuple[SessionRow, Sequence[EventRow], bool]]) -> None:
        calls.append(list(items))
        real(items)

    store.write_many = write_many  # type: ignore[method-assign]
    return calls


def _count_http_commits(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The move ids of every batch commit a source asks over HTTP, recorded."""
    asked: list[list[str]] = []
    real = Peer.commit_batch

    def commit_batch(peer: Peer, move_ids: list[str]) -> BatchCommitAnswer:
        asked.append(list(move_ids))
        return real(peer, move_ids)

    monkeypatch.setattr(Peer, "commit_batch", commit_batch)
    return asked


def test_a_drain_goes_in_one_batch_over_the_data_port_bit_exact_and_gone_from_a(
    tmp_path: Path,
    shm_dir: Path,
    daemon_factory: Callable[[Settings], Daemon],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pair = make_pair(tmp_path, shm_dir, daemon_factory, ROOM, ROOM)
    http_commits = _count_http_commits(monkeypatch)
    ids = [f"agent-{i:02d}" for i in range(12)]
    kv = {}
    for i, sid in enumerate(ids):
        park_session(pair.a, sid, f"agent {i} works on its own task number {i * 7}")
        kv[sid] = parked_bytes(pair.a, sid)
    on_a, on_b = _count_writes(pair.a), _count_writes(pair.b)
    body = {"to": pair.b.url, "to_token": pair.b_admin}
    drained = pair.a.client.post("/v1/moves/drain", json=body)
    assert drained.status_code == 200, drained.text
    out = drained.json()
    assert out["moved"] == len(ids) and out["failed"] == [] and out["data_port"] == len(ids)
    # One transaction at each end for the whole batch: B parks all, then A drops all.
    assert [len(items) for items in on_b] == [len(ids)]
    assert [len(items) for items in on_a] == [len(ids)]
    assert [e.kind for _, events, _ in on_b[0] for e in events] == ["moved_in"] * len(ids)
    assert http_commits == []  # asked on the data connection, after the blocks
    for sid in ids:
        assert parked_bytes(pair.b, sid) == kv[sid]
        assert pair.a.client.get(f"/v1/sessions/{sid}").status_code == 404
    pair.a.runtime.parking.check_invariants()
    pair.b.runtime.parking.check_invariants()


def test_a_drain_to_a_target_without_data_port_goes_in_http_chunks_in_batches_it_takes(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    small_bodies = {**ROOM, "moves": {"data": "off"}, "limits": {"max_body_bytes": 8192}}
    pair = make_pair(tmp_path, shm_dir, daemon_factory, small_bodies, ROOM)
    ids = [f"agent-{i}" for i in range(8)]
    kv = {}
    for i, sid in enumerate(ids):
        park_session(pair.a, sid, f"agent {i} works on its own task number {i * 7}")
        kv[sid] = parked_bytes(pair.a, sid)
    on_b = _count_writes(pair.b)
    body = {"to": pair.b.url, "to_token": pair.b_admin}
    out = pair.a.client.post("/v1/moves/drain", json=body).json()
    assert out["moved"] == len(ids) and out["data_port"] == 0, out
    # All 8 manifests are more than one body: B answered 413, A sent smaller batches.
    assert 1 < len(on_b) < len(ids) and sum(len(items) for items in on_b) == len(ids)
    for sid in ids:
        assert parked_bytes(pair.b, sid) == kv[sid]
    pair.b.runtime.parking.check_invariants()


def test_a_batch_with_sessions_the_target_has_no_room_for_moves_the_others(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    small = {"tiers": {"dram": {"capacity": 0}, "shm": {"capacity": 30 * 4096}}}
    pair = make_pair(tmp_path, shm_dir, daemon_factory, small, ROOM)
    ids = ["first", "second", "third"]
    kv = {}
    for sid in ids:  # 13 blocks each: two fit in 30, the third does not
        park_session(pair.a, sid, f"{sid}: {LONG_PROMPT}")
        kv[sid] = parked_bytes(pair.a, sid)
    body = {"to": pair.b.url, "to_token": pair.b_admin}
    out = pair.a.client.post("/v1/moves/drain", json=body).json()
    assert out["moved"] == 2, out
    [failed] = out["failed"]
    assert failed["session_id"] == "third" and "full" in failed["error"]
    assert parked_bytes(pair.a, "third") == kv["third"]  # untouched on A
    assert not pair.a.runtime.parking.live("default", "third").busy
    for sid in ("first", "second"):
        assert parked_bytes(pair.b, sid) == kv[sid]
    pair.b.runtime.parking.check_invariants()


def test_a_data_connection_cut_mid_stream_is_picked_up_and_sends_each_block_once(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    pair = make_pair(tmp_path, shm_dir, daemon_factory)
    park_session(pair.a, "long", LONG_PROMPT)
    kv = parked_bytes(pair.a, "long")
    block = pair.a.runtime.parking.geometry.block_nbytes
    blocks = len(kv) // block
    data = _moves(pair.b).data
    data.group_bytes = block  # each block checked (and kept) as it lands
    _moves(pair.a).exporter.retries = 1
    with CuttingProxy(data.port, cut_after=5 * block + block // 2) as proxy:
        _moves(pair.a).batches.data_address = lambda host, port: (host, proxy.port)
        landed, result, sent_again = cut_then_resumed(pair, proxy, blocks)
        assert result["data_port"] is True and result["blocks_sent"] == blocks - landed
        # What went the second time: the ticket, the blocks B still lacked and the commit
        # asked, nothing more.
        assert sent_again == len(HELLO) + TICKET_LEN + (blocks - landed) * block + len(COMMIT)
    assert parked_bytes(pair.b, "long") == kv
    events = pair.b.client.get("/v1/events", params={"session_id": "long"}).json()["events"]
    moved_in = [e for e in events if e["kind"] == "moved_in"]
    assert len(moved_in) == 1 and moved_in[0]["bytes"] == blocks * block  # each block once
    assert pair.a.client.get("/v1/sessions/long").status_code == 404
    pair.b.runtime.parking.check_invariants()


def test_a_commit_whose_answer_the_data_connection_lost_is_learned_by_asking_again(
    tmp_path: Path,
    shm_dir: Path,
    daemon_factory: Callable[[Settings], Daemon],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pair = make_pair(tmp_path, shm_dir, daemon_factory)
    park_session(pair.a, "long", LONG_PROMPT)
    kv = parked_bytes(pair.a, "long")
    blocks = len(kv) // pair.a.runtime.parking.geometry.block_nbytes
    _moves(pair.a).exporter.retries = 1
    http_commits = _count_http_commits(monkeypatch)
    with CuttingProxy(_moves(pair.b).data.port) as proxy:
        proxy.cut_replies_after = ACK.size  # B took every block and the commit; its answer is lost
        _moves(pair.a).batches.data_address = lambda host, port: (host, proxy.port)
        moved = pair.move("long")
    assert moved.status_code == 200, moved.text
    result = moved.json()
    assert proxy.cuts == 1 and result["retries"] == 1 and result["blocks_sent"] == blocks
    # B had committed: asked again, its begin said so; nothing was sent or committed twice.
    assert http_commits == []
    assert parked_bytes(pair.b, "long") == kv
    events = pair.b.client.get("/v1/events", params={"session_id": "long"}).json()["events"]
    assert [e["kind"] for e in events].count("moved_in") == 1
    assert pair.a.client.get("/v1/sessions/long").status_code == 404
    pair.a.runtime.parking.check_invariants()
    pair.b.runtime.parking.check_invariants()


# ---- what the port refuses ---------------------------------------------------------------


def _begin(pair: Pair, session_id: str) -> tuple[str, DataOffer, bytes]:
    """A's manifest of ``session_id`` begun at B by hand: the move id, B's data offer, and
    the blocks in wire form."""
    exporter = _moves(pair.a).exporter
    live = exporter.take(("default", session_id), pair.b.url)
    move_id, _, manifest = exporter.prepare(live, pair.b.url)
    body = {"manifests": [manifest.model_dump()], "data": True}
    answer = pair.b.client.post("/v1/moves/in-batch", json=body)
    assert answer.status_code == 200, answer.text
    begun = BatchBeginAnswer.model_validate(answer.json())
    assert begun.data is not None
    exporter.let_go(live)  # A keeps it parked, its move open: a later move picks it up
    return move_id, begun.data, parked_bytes(pair.a, session_id)


def _connect(pair: Pair, hello: bytes) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", _moves(pair.b).data.port), timeout=20)
    conn.sendall(hello)
    return conn


def _answer(conn: socket.socket) -> bytes:
    """Everything the target writes until it closes (b"": nothing)."""
    got = b""
    try:
        while chunk := conn.recv(4096):
            got += chunk
    except ConnectionResetError:
        pass
    conn.close()
    return got


def test_a_connection_without_a_good_ticket_is_closed_having_written_nothing(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    pair = make_pair(tmp_path, shm_dir, daemon_factory)
    park_session(pair.a, "s", LONG_PROMPT)
    move_id, offer, kv = _begin(pair, "s")
    importer = _moves(pair.b).importer
    ticket_id, secret = offer.ticket.split(".")
    wrong = f"{ticket_id}.{'0' * len(secret)}".encode()
    other = f"{'f' * len(ticket_id)}.{secret}".encode()
    for hello in (HELLO + wrong, HELLO + other, b"GET / HTTP/1.1\r\n" * 5):
        assert _answer(_connect(pair, hello + kv)) == b""
    assert importer.received(move_id) == 0

    tickets = _moves(pair.b).data.tickets  # expired: the clock moved past its time
    real = tickets.clock
    tickets.clock = lambda: real() + offer.expires_s + 1
    assert _answer(_connect(pair, HELLO + offer.ticket.encode() + kv)) == b""
    assert importer.received(move_id) == 0
    tickets.clock = real

    move_id, offer, kv = _begin(pair, "s")  # again: a fresh ticket, good once
    good = _answer(_connect(pair, HELLO + offer.ticket.encode() + kv))
    assert ACK.unpack(good) == (OK, len(kv) // 4096)
    assert _answer(_connect(pair, HELLO + offer.ticket.encode() + kv)) == b""  # reused
    assert importer.received(move_id) == len(kv) // 4096
    assert importer.landing(move_id).written == len(kv) // 4096  # written once


def test_a_peer_that_sends_more_than_reserved_or_a_bad_block_is_cut(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    pair = make_pair(tmp_path, shm_dir, daemon_factory)
    park_session(pair.a, "s", LONG_PROMPT)
    importer = _moves(pair.b).importer
    move_id, offer, kv = _begin(pair, "s")
    assert offer.nbytes == len(kv)
    bad = bytearray(kv)
    bad[4096 + 7] ^= 0xFF  # block 1 is not what its digest says
    answer = _answer(_connect(pair, HELLO + offer.ticket.encode() + bytes(bad)))
    assert ACK.unpack(answer) == (BAD_BLOCK, 1)  # block 0 kept, nothing after it
    assert importer.received(move_id) == 1

    move_id, offer, kv = _begin(pair, "s")
    assert offer.nbytes == len(kv) - 4096  # only what is missing
    conn = _connect(pair, HELLO + offer.ticket.encode() + kv[4096:])
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        conn.sendall(b"\x00" * (4 << 20))  # past the reservation: never read
    answer = _answer(conn)
    assert answer == b"" or ACK.unpack(answer) == (OK, len(kv) // 4096 - 1)
    landing = importer.landing(move_id)
    assert landing is not None and landing.missing() == [] and landing.written == len(kv) // 4096
    commit = pair.b.client.post("/v1/moves/in-batch/commit", json={"move_ids": [move_id]})
    assert commit.json()["items"][0]["commit"]["blocks_received"] == len(kv) // 4096
    assert parked_bytes(pair.b, "s") == kv


def test_a_stalled_peer_is_cut_and_connections_past_the_cap_are_closed(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    capped = {"moves": {"data_idle_s": 1.0, "data_connections": 1}}
    pair = make_pair(tmp_path, shm_dir, daemon_factory, capped)
    park_session(pair.a, "s", LONG_PROMPT)
    move_id, offer, kv = _begin(pair, "s")
    stalled = _connect(pair, HELLO + offer.ticket.encode() + kv[:6000])  # then silence
    # The one connection allowed is taken: another is closed before anything is read.
    assert _answer(_connect(pair, b"")) == b""
    answer = _answer(stalled)  # cut after data_idle_s of silence (the recv returns)
    assert answer == b"" or ACK.unpack(answer)[0] != OK
    assert _moves(pair.b).importer.received(move_id) == 0
    # The move itself goes through afterwards, on a fresh ticket.
    moved = pair.move("s")
    assert moved.status_code == 200 and moved.json()["data_port"] is True, moved.text
    assert parked_bytes(pair.b, "s") == kv
