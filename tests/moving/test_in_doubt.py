"""The hand-over's two phases across a crash: the target committed, the source never
dropped its copy. The source holds the session (serves nothing of it) across its restart
until the move is run again, which finds the target owns it and drops it here: one owner."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from agentpark.config import Settings
from agentpark.errors import StorageUnavailableError
from agentpark.parking.registry import LiveSession
from tests.harness import Daemon
from tests.moving.pair import admin, make_pair, pair_settings, park_session, parked_bytes


def test_a_source_that_never_dropped_a_committed_session_holds_it_until_the_move_runs_again(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    pair = make_pair(tmp_path, shm_dir, daemon_factory)
    park_session(pair.a, "s", "a session caught between two daemons")
    kv = parked_bytes(pair.a, "s")

    def crash(lives: Sequence[LiveSession], peer: str, move_ids: Sequence[str]) -> None:
        raise StorageUnavailableError("the source's disk failed right after the commit")

    # The target commits; the source cannot write that it dropped its copy (as if it died).
    pair.a.runtime.parking.transitions.moved_out_many = crash  # type: ignore[method-assign]
    first = pair.move("s")
    assert first.status_code == 502 and first.json()["error"]["details"]["in_doubt"] is True
    assert pair.b.client.get("/v1/sessions/s").json()["state"] == "parked"  # B owns it
    assert pair.a.client.post("/v1/sessions/s/resume").status_code == 409  # A serves nothing

    pair.a.stop()  # no drain: what a crash leaves
    a = daemon_factory(pair_settings(tmp_path, shm_dir, "a"))
    admin(a)
    assert a.client.get("/v1/sessions/s").json()["state"] == "parked"  # still in A's shm...
    busy = a.client.post("/v1/sessions/s/resume")
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "session_busy"  # held

    body = {"session_id": "s", "to": pair.b.url, "to_token": pair.b_admin}
    again = a.client.post("/v1/moves", json=body)
    assert again.status_code == 200, again.text
    assert again.json()["resumed"] is True and again.json()["blocks_sent"] == 0
    assert a.client.get("/v1/sessions/s").status_code == 404  # dropped at last
    assert parked_bytes(pair.b, "s") == kv
    moved_in = [
        e
        for e in pair.b.client.get("/v1/events", params={"session_id": "s"}).json()["events"]
        if e["kind"] == "moved_in"
    ]
    assert len(moved_in) == 1
    a.runtime.parking.check_invariants()


def test_a_drained_batch_whose_drop_failed_is_held_each_and_finished_by_a_drain_again(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    pair = make_pair(tmp_path, shm_dir, daemon_factory)
    ids = ["one", "two", "three"]
    kv = {}
    for sid in ids:
        park_session(pair.a, sid, f"session {sid} caught between two daemons")
        kv[sid] = parked_bytes(pair.a, sid)

    def crash(lives: Sequence[LiveSession], peer: str, move_ids: Sequence[str]) -> None:
        raise StorageUnavailableError("the source's disk failed right after the commit")

    pair.a.runtime.parking.transitions.moved_out_many = crash  # type: ignore[method-assign]
    body = {"to": pair.b.url, "to_token": pair.b_admin}
    first = pair.a.client.post("/v1/moves/drain", json=body).json()
    assert first["moved"] == 0 and sorted(f["session_id"] for f in first["failed"]) == sorted(ids)
    for sid in ids:  # B owns each; A serves nothing of any
        assert pair.b.client.get(f"/v1/sessions/{sid}").json()["state"] == "parked"
        assert pair.a.client.post(f"/v1/sessions/{sid}/resume").status_code == 409

    pair.a.stop()
    a = daemon_factory(pair_settings(tmp_path, shm_dir, "a"))
    admin(a)
    for sid in ids:  # held across the restart
        assert a.client.post(f"/v1/sessions/{sid}/resume").status_code == 409
    again = a.client.post("/v1/moves/drain", json=body).json()
    assert again["moved"] == len(ids) and again["failed"] == [] and again["bytes_sent"] == 0
    for sid in ids:
        assert a.client.get(f"/v1/sessions/{sid}").status_code == 404
        assert parked_bytes(pair.b, sid) == kv[sid]
    a.runtime.parking.check_invariants()
