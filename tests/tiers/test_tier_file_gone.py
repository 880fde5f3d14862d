"""A tier file removed or replaced while the daemon runs is noticed, logged once, counted.

Reproducer of issue 10 item 7: an shm file removed while the daemon runs was not noticed
until restart (its sessions still showed parked, and nothing counted them lost).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from agentpark.config import Settings
from agentpark.tiers.filetier import FileTier
from tests.harness import Daemon, settled, wait_until

PROMPT = {"prompt": "keep this in shared memory", "max_new_tokens": 8}


def _park_in_shm(daemon: Daemon, sid: str) -> dict[str, object]:
    c = daemon.client
    assert c.post("/v1/sessions", json={"session_id": sid}).status_code == 201
    assert c.post(f"/v1/sessions/{sid}/generate", json=PROMPT).status_code == 200
    parked = c.post(f"/v1/sessions/{sid}/pause", json={"tier": "shm", "force": True})
    assert parked.json()["tier"] == "shm"
    out: dict[str, object] = c.get(f"/v1/sessions/{sid}").json()
    return out


def _metric(daemon: Daemon, name: str, label: str) -> float:
    text = daemon.client.get("/metrics").text
    for line in text.splitlines():
        if line.startswith(name) and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _lost_metric(daemon: Daemon) -> float:
    return _metric(daemon, "agentpark_sessions_lost_total", "tier_file_missing")


def _shm(daemon: Daemon) -> FileTier:
    tier = daemon.runtime.parking.tiers["shm"]
    assert isinstance(tier, FileTier)
    return tier


def test_a_removed_shm_file_is_noticed_on_the_next_tick(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agentpark")
    c = daemon.client
    row = _park_in_shm(daemon, "s")
    path = _shm(daemon).path
    old_inode = path.stat().st_ino
    path.unlink()
    # The policy tick notices: the session is lost, counted, and the file made again.
    wait_until(lambda: settled(daemon, "s", "lost"))
    assert "removed" in c.get("/v1/sessions/s").json()["lost_reason"]
    assert _lost_metric(daemon) == 1.0
    # The alert on restore failures fires too: that parked copy can never be restored.
    assert _metric(daemon, "agentpark_restore_failures_total", 'tier="shm"') == 1.0
    wait_until(lambda: path.exists() and _shm(daemon).gone is None)
    assert path.stat().st_ino != old_inode
    assert _shm(daemon).used_blocks == 0
    events = c.get("/v1/events", params={"session_id": "s"}).json()["events"]
    assert events[0]["kind"] == "lost" and events[0]["reason"] == "tier_file_missing"
    # Recomputed from its tokens on the next generate; the new file takes new pauses.
    out = c.post("/v1/sessions/s/generate", json={"max_new_tokens": 2}).json()
    assert out["restored_from"] == "recompute" and out["num_tokens"] == row["num_tokens"] + 2
    again = c.post("/v1/sessions/s/pause", json={"tier": "shm", "force": True}).json()
    assert again["tier"] == "shm"
    daemon.runtime.driver.check_invariants()
    noticed = [r for r in caplog.records if "while the daemon runs" in r.getMessage()]
    assert len(noticed) == 1  # once, not every tick


def test_a_replaced_shm_file_is_noticed_at_the_next_restore(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    daemon = daemon_factory(make_settings(policy={"enabled": False}))  # no tick: the use sees it
    c = daemon.client
    _park_in_shm(daemon, "s")
    path = _shm(daemon).path
    stranger = path.with_name("stranger")
    stranger.write_bytes(b"not a tier file")
    os.chmod(stranger, 0o600)
    os.replace(stranger, path)
    out = c.post("/v1/sessions/s/resume").json()
    assert out["restored_from"] == "recompute" and out["state"] == "active"
    events = c.get("/v1/events", params={"session_id": "s"}).json()["events"]
    lost = [e for e in events if e["kind"] == "lost"]
    assert lost and lost[0]["reason"] == "tier_file_missing"
    assert "replaced" in (lost[0]["detail"] or "")
    assert _lost_metric(daemon) == 1.0
    assert _shm(daemon).gone is not None  # no tick yet to make the file again
    refused = c.post("/v1/sessions/s/pause", json={"tier": "shm", "force": True})
    assert refused.status_code == 507 and refused.json()["error"]["code"] == "tier_full"
    assert c.post("/v1/sessions/s/pause", json={"force": True}).json()["tier"] == "dram"
    daemon.runtime.parking.check_tier_files()  # what a tick does
    tier = _shm(daemon)
    assert tier.gone is None and path.read_bytes()[:8] == b"AGPKTIER"
    assert [p.name for p in Path(path.parent).glob(f"{path.name}.mismatch-*")]  # moved aside


def test_a_removed_shm_folder_is_never_made_again(daemon: Daemon) -> None:
    """Removing the tier's whole folder (a clean-up) loses its sessions as a removed file
    does, but the daemon does not bring the folder back behind the one who removed it."""
    import shutil

    _park_in_shm(daemon, "f")
    folder = _shm(daemon).path.parent
    shutil.rmtree(folder)
    wait_until(lambda: settled(daemon, "f", "lost"))
    daemon.runtime.parking.check_tier_files()  # a tick more: it would re-create it here
    assert not folder.exists()
    assert _shm(daemon).gone is not None
    folder.mkdir()  # for the fixture's drain at shutdown
