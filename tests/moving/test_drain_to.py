"""``agentpark drain --to``: every parked session handed to another daemon, then both
daemons restarted: each session exactly once, on B."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agentpark.cli.entry import main
from agentpark.config import Settings
from tests.harness import Daemon
from tests.moving.pair import admin, make_pair, pair_settings

N = 100
ROOM = {"tiers": {"shm": {"capacity": 256 * 4096}}}


def _sessions(daemon: Daemon) -> dict[str, str]:
    """Every live session of the daemon (all pages): id -> state."""
    found: dict[str, str] = {}
    params: dict[str, str | int] = {"limit": 500}
    while True:
        page = daemon.client.get("/v1/sessions", params=params).json()
        found.update({s["session_id"]: s["state"] for s in page["sessions"]})
        if not page.get("next_cursor"):
            return found
        params["cursor"] = page["next_cursor"]


def test_drain_to_a_peer_hands_over_every_parked_session_once_across_restarts(
    tmp_path: Path,
    shm_dir: Path,
    daemon_factory: Callable[[Settings], Daemon],
    capsys: pytest.CaptureFixture[str],
) -> None:
    pair = make_pair(tmp_path, shm_dir, daemon_factory, ROOM, ROOM)
    c = pair.a.client
    for i in range(N):
        sid = f"agent-{i:03d}"
        assert c.post("/v1/sessions", json={"session_id": sid}).status_code == 201
        c.post(f"/v1/sessions/{sid}/generate", json={"prompt": f"agent {i}", "max_new_tokens": 4})
        assert c.post(f"/v1/sessions/{sid}/pause", json={"tier": "shm"}).json()["state"] == "parked"
    c.post("/v1/sessions", json={"session_id": "stays-active"})  # not parked: stays on A

    source = ["--url", pair.a.url, "--token", pair.a_admin]
    code = main(["drain", *source, "--to", pair.b.url, "--to-token", pair.b_admin])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"{N} moved" in out and "1 not parked" in out

    pair.a.stop()
    pair.b.stop()
    a = daemon_factory(pair_settings(tmp_path, shm_dir, "a", **ROOM))
    b = daemon_factory(pair_settings(tmp_path, shm_dir, "b", **ROOM))
    admin(a)
    admin(b)
    on_a, on_b = _sessions(a), _sessions(b)
    assert on_a == {"stays-active": "active"}
    assert sorted(on_b) == [f"agent-{i:03d}" for i in range(N)]
    assert set(on_b.values()) == {"parked"}  # re-attached from B's shm tier
    resumed = b.client.post("/v1/sessions/agent-042/resume").json()
    assert resumed["restored_from"] == "shm"
    b.runtime.parking.check_invariants()
    a.runtime.parking.check_invariants()
