"""Tier files with parked data next to a database that knows no session: refuse, adopt, discard.

Reproducer of issue 10 item 3: an empty agentpark.db next to populated shm/disk tier
files started silently with 0 sessions.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from agentpark.config import Settings
from agentpark.errors import ConfigError
from agentpark.parking import PauseOrder
from agentpark.runtime import Runtime
from agentpark.tiers.filetier import FileTier
from tests.harness import write_config

DISK = {"disk": {"capacity": 32 * 4096}}


def _park_and_stop(settings: Settings) -> dict[str, Path]:
    """A daemon parks one session in shm and one on disk, then stops; the tier files."""
    runtime = Runtime.start(settings)
    try:
        core = runtime.parking
        for sid, tier in (("a", "shm"), ("b", "disk")):
            core.create("t", sid, None)
            runtime.driver.generate("t", sid, [5, 6, 7] * 10, 4)
            core.pause("t", sid, PauseOrder(tier=tier, force=True))
        return {name: _tier(runtime, name).path for name in ("shm", "disk")}
    finally:
        runtime.shutdown()


def _tier(runtime: Runtime, name: str) -> FileTier:
    tier = runtime.parking.tiers[name]
    assert isinstance(tier, FileTier)
    return tier


def _remove_database(settings: Settings) -> None:
    db = settings.state_dir / "agentpark.db"
    for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        path.unlink(missing_ok=True)


@pytest.fixture
def orphans(make_settings: Callable[..., Settings]) -> tuple[Settings, dict[str, Path]]:
    settings = make_settings(tiers=DISK)
    files = _park_and_stop(settings)
    _remove_database(settings)
    return settings, files


def test_an_empty_database_next_to_tier_files_with_data_refuses_to_start(
    orphans: tuple[Settings, dict[str, Path]],
) -> None:
    settings, files = orphans
    inodes = {name: path.stat().st_ino for name, path in files.items()}
    with pytest.raises(ConfigError) as refused:
        Runtime.start(settings)
    message = refused.value.message
    for path in files.values():
        assert str(path) in message
    assert "--tier-files adopt" in message and "--tier-files discard" in message
    # Nothing was touched, and nothing is held: the files are as they were.
    assert {name: path.stat().st_ino for name, path in files.items()} == inodes
    with pytest.raises(ConfigError):
        Runtime.start(settings)  # refused again, not "in use by another daemon"


def test_adopt_keeps_the_files_with_every_slot_free(
    orphans: tuple[Settings, dict[str, Path]], caplog: pytest.LogCaptureFixture
) -> None:
    settings, files = orphans
    inodes = {name: path.stat().st_ino for name, path in files.items()}
    caplog.set_level(logging.INFO, logger="agentpark")
    adopt = settings.model_copy(
        update={"reliability": settings.reliability.model_copy(update={"tier_files": "adopt"})}
    )
    runtime = Runtime.start(adopt)
    try:
        for name, path in files.items():
            tier = _tier(runtime, name)
            assert tier.path == path and path.stat().st_ino == inodes[name]
            assert tier.used_blocks == 0 and tier.holds_data()
        assert runtime.parking.live_sessions() == []
    finally:
        runtime.shutdown()
    adopted = [r.getMessage() for r in caplog.records if "adopted" in r.getMessage()]
    assert len(adopted) == 2 and all("every slot is free" in m for m in adopted)


def test_discard_moves_the_files_aside_and_starts_new_ones(
    orphans: tuple[Settings, dict[str, Path]], caplog: pytest.LogCaptureFixture
) -> None:
    settings, files = orphans
    inodes = {name: path.stat().st_ino for name, path in files.items()}
    caplog.set_level(logging.INFO, logger="agentpark")
    discard = settings.model_copy(
        update={"reliability": settings.reliability.model_copy(update={"tier_files": "discard"})}
    )
    runtime = Runtime.start(discard)
    try:
        for name, path in files.items():
            tier = _tier(runtime, name)
            assert path.stat().st_ino != inodes[name] and not tier.holds_data()
            (aside,) = path.parent.glob(f"{path.name}.mismatch-*")  # the one aside name
            assert aside.stat().st_ino == inodes[name]  # moved, never deleted
    finally:
        runtime.shutdown()
    assert sum("tier: discarded" in r.getMessage() for r in caplog.records) == 2


def test_a_database_that_knows_sessions_starts_as_before(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(tiers=DISK)
    _park_and_stop(settings)
    runtime = Runtime.start(settings)  # its own database: the parked sessions re-attach
    try:
        states = {r.session_id: (r.state, r.tier) for r in runtime.parking.live_sessions()}
        assert states == {"a": ("parked", "shm"), "b": ("parked", "disk")}
    finally:
        runtime.shutdown()


def test_serve_exits_2_naming_the_files(
    orphans: tuple[Settings, dict[str, Path]], tmp_path: Path
) -> None:
    settings, files = orphans
    config = write_config(tmp_path / "agentpark.toml", settings)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPARK_")}
    cmd = [sys.executable, "-m", "agentpark", "serve", "--config", str(config), "--port", "0"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "agentpark: tier files hold parked data" in done.stderr
    for path in files.values():
        assert str(path) in done.stderr
