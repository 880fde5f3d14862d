"""Moves the target or the source refuses: the session stays on A, untouched."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agentpark.config import Settings
from tests.harness import Daemon
from tests.moving.pair import make_pair, park_session, parked_bytes

LONG_PROMPT = "a long agent context, " * 8  # 13 blocks


def _untouched(daemon: Daemon, session_id: str, kv: bytes) -> None:
    row = daemon.client.get(f"/v1/sessions/{session_id}").json()
    assert row["state"] == "parked" and not daemon.runtime.parking.live("default", session_id).busy
    assert parked_bytes(daemon, session_id) == kv
    daemon.runtime.parking.check_invariants()


def test_a_target_without_room_answers_507_at_the_source_and_nothing_is_lost(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    small = {"tiers": {"dram": {"capacity": 0}, "shm": {"capacity": 2 * 4096}}}
    pair = make_pair(tmp_path, shm_dir, daemon_factory, small)
    park_session(pair.a, "big", LONG_PROMPT)
    kv = parked_bytes(pair.a, "big")
    refused = pair.move("big")
    assert refused.status_code == 507, refused.text
    error = refused.json()["error"]
    assert error["code"] == "tier_full" and pair.b.url in error["message"]
    _untouched(pair.a, "big", kv)
    assert pair.b.client.get("/v1/sessions/big").status_code == 404
    assert pair.b.runtime.parking.tiers["shm"].used_blocks == 0
    # And it still restores on A.
    out = pair.a.client.post("/v1/sessions/big/resume")
    assert out.json()["restored_from"] == "shm"


def test_a_move_without_the_right_token_is_refused_at_both_ends(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    pair = make_pair(tmp_path, shm_dir, daemon_factory)
    park_session(pair.a, "s", "a session that must not leave")
    kv = parked_bytes(pair.a, "s")
    body = {"session_id": "s", "to": pair.b.url, "to_token": pair.b_admin}
    # At the source: no token, or one without the admin scope.
    anonymous = pair.a.client.post("/v1/moves", json=body, headers={"Authorization": ""})
    assert anonymous.status_code == 401
    user = pair.a.token("default", "sessions,operator")
    scoped = pair.a.client.post("/v1/moves", json=body, headers={"Authorization": f"Bearer {user}"})
    assert scoped.status_code == 403
    # At the target: A's own admin token, a sessions token of B, garbage.
    for wrong, status in (
        (pair.a_admin, 401),
        (pair.b.token("default", "sessions"), 403),
        ("apk_nope_nope", 401),
    ):
        refused = pair.move("s", token=wrong)
        assert refused.status_code == 502, refused.text
        assert refused.json()["error"]["details"]["peer_status"] == status
    _untouched(pair.a, "s", kv)
    assert pair.b.client.get("/v1/sessions/s").status_code == 404
    # The target's import routes refuse a caller without its admin token too.
    direct = pair.b.client.post(
        "/v1/moves/in", json={}, headers={"Authorization": f"Bearer {pair.a_admin}"}
    )
    assert direct.status_code == 401
    assert pair.move("s").status_code == 200  # with the right one it goes


def test_a_target_of_another_model_refuses_with_409_naming_why(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    pair = make_pair(tmp_path, shm_dir, daemon_factory, {"model": {"seed": 7}})
    park_session(pair.a, "s", "a session of another model")
    kv = parked_bytes(pair.a, "s")
    refused = pair.move("s")
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "layout_mismatch" and "model" in error["message"]
    _untouched(pair.a, "s", kv)


def test_only_a_parked_session_moves(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    pair = make_pair(tmp_path, shm_dir, daemon_factory)
    pair.a.client.post("/v1/sessions", json={"session_id": "active"})
    refused = pair.move("active")
    assert refused.status_code == 409 and "pause it first" in refused.json()["error"]["message"]
    assert pair.move("nobody").status_code == 404
