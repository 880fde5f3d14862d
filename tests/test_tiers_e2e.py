"""Parked agents survive the daemon: kill -9, SIGTERM drain, damaged or foreign tier files."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentpark.config import Settings
from agentpark.tiers.filetier import HEADER_BYTES
from tests.harness import Daemon, DaemonProcess, free_port, write_config

PROMPT = "Plan a trip; call the flight search tool."
FIRST = {"prompt": PROMPT, "max_new_tokens": 20}
NEXT = {"max_new_tokens": 12, "return_logits": True}


def _twin_continuation(c: httpx.Client, sid: str) -> dict[str, Any]:
    """What a never-paused session with the same history generates next (the reference)."""
    c.post("/v1/sessions", json={"session_id": sid})
    c.post(f"/v1/sessions/{sid}/generate", json=FIRST)
    out: dict[str, Any] = c.post(f"/v1/sessions/{sid}/generate", json=NEXT).json()
    return out


def test_kill_9_then_restart_resumes_shm_parked_sessions_bit_exact(
    make_settings: Callable[..., Settings],
    daemon_process: Callable[[Path, int], DaemonProcess],
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path / "agentpark.toml", make_settings())
    port = free_port()
    first = daemon_process(config, port)
    for sid in ("a", "b"):
        first.client.post("/v1/sessions", json={"session_id": sid})
        first.client.post(f"/v1/sessions/{sid}/generate", json=FIRST)
        parked = first.client.post(f"/v1/sessions/{sid}/pause", json={"tier": "shm"}).json()
        assert parked["state"] == "parked" and parked["tier"] == "shm"
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL

    second = daemon_process(config, port)
    c = second.client
    assert c.get("/v1/sessions/a").json()["state"] == "parked"
    reference = _twin_continuation(c, "twin")
    for sid in ("a", "b"):
        resumed = c.post(f"/v1/sessions/{sid}/resume").json()
        assert resumed["restored_from"] == "shm"
        out = c.post(f"/v1/sessions/{sid}/generate", json=NEXT).json()
        assert out["tokens"] == reference["tokens"]
        assert out["logits"] == reference["logits"]
    second.stop(signal.SIGTERM)


def test_sigterm_drains_active_and_dram_parked_sessions_to_shm(
    make_settings: Callable[..., Settings],
    daemon_process: Callable[[Path, int], DaemonProcess],
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path / "agentpark.toml", make_settings())
    port = free_port()
    first = daemon_process(config, port)
    for sid in ("active", "in-dram"):
        first.client.post("/v1/sessions", json={"session_id": sid})
        first.client.post(f"/v1/sessions/{sid}/generate", json=FIRST)
    assert first.client.post("/v1/sessions/in-dram/pause").json()["tier"] == "dram"
    code = first.stop(signal.SIGTERM)
    assert code in (0, -signal.SIGTERM)
    assert any("drain:" in line and "'lost': 0" in line for line in first.log), first.log

    second = daemon_process(config, port)
    c = second.client
    states = {
        s["session_id"]: (s["state"], s["tier"]) for s in c.get("/v1/sessions").json()["sessions"]
    }
    assert states == {"active": ("parked", "shm"), "in-dram": ("parked", "shm")}
    reference = _twin_continuation(c, "twin")
    for sid in ("active", "in-dram"):
        out = c.post(f"/v1/sessions/{sid}/generate", json=NEXT).json()
        assert out["resumed"] is True and out["restored_from"] == "shm"
        assert out["tokens"] == reference["tokens"] and out["logits"] == reference["logits"]
    drains = c.get("/v1/events", params={"session_id": "active"}).json()["events"]
    assert any(e["kind"] == "pause" and e["reason"] == "drain" for e in drains)
    second.stop(signal.SIGTERM)


def test_agentpark_drain_parks_everything_and_stops_the_daemon(
    make_settings: Callable[..., Settings],
    daemon_process: Callable[[Path, int], DaemonProcess],
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    config = write_config(tmp_path / "agentpark.toml", make_settings())
    daemon = daemon_process(config, free_port())
    daemon.client.post("/v1/sessions", json={"session_id": "s"})
    daemon.client.post("/v1/sessions/s/generate", json=FIRST)
    # Drain is admin, even on loopback: a token made by the CLI while the daemon runs.
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentpark",
            "--config",
            str(config),
            "token",
            "create",
            "--tenant",
            "ops",
            "--scope",
            "admin",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    out = subprocess.run(
        [sys.executable, "-m", "agentpark", "--config", str(config), "drain", "--url", daemon.url],
        env={**os.environ, "AGENTPARK_TOKEN": made.stdout.strip()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "1 parked" in out.stdout and "0 will be recomputed" in out.stdout
    assert daemon.proc.wait(timeout=60) in (0, -signal.SIGTERM)


def test_a_tier_file_for_another_model_is_moved_aside_and_its_sessions_recomputed(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    shm_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = daemon_factory(make_settings())
    c = first.client
    c.post("/v1/sessions", json={"session_id": "s"})
    history = list(PROMPT.encode()) + c.post("/v1/sessions/s/generate", json=FIRST).json()["tokens"]
    c.post("/v1/sessions/s/pause", json={"tier": "shm"})
    first.stop()

    other_model = make_settings(model={"seed": 7})  # same geometry, other weights
    second = daemon_factory(other_model)
    c = second.client
    aside = sorted(shm_dir.glob("tier.mismatch-*"))
    assert len(aside) == 1 and aside[0].stat().st_size > HEADER_BYTES  # moved, not deleted
    assert (shm_dir / "tier").exists()  # a fresh, empty tier took its place
    assert any(
        "refusing to attach" in r.message and "model_uid" in r.message for r in caplog.records
    )
    row = c.get("/v1/sessions/s").json()
    assert row["state"] == "lost" and "model_uid" in row["lost_reason"]
    assert c.post("/v1/sessions/s/resume").json()["restored_from"] == "recompute"
    out = c.post("/v1/sessions/s/generate", json=NEXT).json()
    c.post("/v1/sessions", json={"session_id": "ref"})
    ref = c.post("/v1/sessions/ref/generate", json={"prompt_tokens": history, **NEXT}).json()
    assert out["tokens"] == ref["tokens"] and out["logits"] == ref["logits"]


@pytest.mark.parametrize("tier", ["shm", "disk"])
def test_a_flipped_byte_in_a_parked_copy_is_caught_and_the_session_recomputed(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    tmp_path: Path,
    tier: str,
) -> None:
    disk = {"capacity": 32 * 4096, "path": tmp_path / "disk-tier.bin"}
    daemon = daemon_factory(make_settings(tiers={"disk": disk}))
    c = daemon.client
    c.post("/v1/sessions", json={"session_id": "s"})
    history = list(PROMPT.encode()) + c.post("/v1/sessions/s/generate", json=FIRST).json()["tokens"]
    assert c.post("/v1/sessions/s/pause", json={"tier": tier}).json()["tier"] == tier
    parking = daemon.runtime.parking
    slot = parking.live("default", "s").slots[1]
    path = parking.tiers[tier].path  # type: ignore[attr-defined]
    offset = HEADER_BYTES + slot * daemon.runtime.engine.geometry.block_nbytes + 123
    with path.open("r+b") as f:  # another process damaging the file, as a bad disk would
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))

    resumed = c.post("/v1/sessions/s/resume").json()
    assert resumed["restored_from"] == "recompute"
    events = c.get("/v1/events", params={"session_id": "s"}).json()["events"]
    corrupt = [e for e in events if e["kind"] == "corrupt"]
    assert len(corrupt) == 1 and corrupt[0]["reason"] == "checksum"
    assert f"checksum mismatch in the {tier} tier" in corrupt[0]["detail"]
    assert events[0]["kind"] == "recompute" and "checksum" in events[0]["detail"]
    out = c.post("/v1/sessions/s/generate", json=NEXT).json()
    c.post("/v1/sessions", json={"session_id": "ref"})
    ref = c.post("/v1/sessions/ref/generate", json={"prompt_tokens": history, **NEXT}).json()
    assert out["tokens"] == ref["tokens"] and out["logits"] == ref["logits"]
    assert parking.tiers[tier].used_blocks == 0


def test_auto_fills_dram_then_shm_then_disk_and_moves_restore_from_any_tier(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    tmp_path: Path,
) -> None:
    tiers = {
        "dram": {"capacity": 4 * 4096},
        "shm": {"capacity": 4 * 4096},
        "disk": {"capacity": 4 * 4096, "path": tmp_path / "disk.bin"},
    }
    daemon = daemon_factory(make_settings(tiers=tiers))
    c = daemon.client
    placed = []
    for sid in ("a", "b", "c", "d"):  # 4 blocks each
        c.post("/v1/sessions", json={"session_id": sid})
        c.post(f"/v1/sessions/{sid}/generate", json=FIRST)
        r = c.post(f"/v1/sessions/{sid}/pause")
        placed.append(r.json()["tier"] if r.status_code == 200 else r.json()["error"]["code"])
    assert placed == ["dram", "shm", "disk", "tier_full"]
    assert c.get("/v1/sessions/d").json()["state"] == "active"

    reference = _twin_continuation(c, "twin")
    moved = c.post("/v1/sessions/a/move", json={"tier": "disk"})
    assert moved.status_code == 507  # disk is full
    c.post("/v1/sessions/c/resume")
    moved = c.post("/v1/sessions/a/move", json={"tier": "disk"}).json()
    assert moved["from_tier"] == "dram" and moved["tier"] == "disk"
    bad = c.post("/v1/sessions/d/move", json={"tier": "shm"})
    assert bad.status_code == 409 and bad.json()["error"]["code"] == "invalid_state"
    for sid, tier in (("a", "disk"), ("b", "shm")):
        out = c.post(f"/v1/sessions/{sid}/generate", json=NEXT).json()
        assert out["restored_from"] == tier
        assert out["tokens"] == reference["tokens"] and out["logits"] == reference["logits"]
    host = c.get("/v1/host").json()
    assert {name: t["used_blocks"] for name, t in host["tiers"].items()} == {
        "dram": 0,
        "shm": 0,
        "disk": 0,
    }
