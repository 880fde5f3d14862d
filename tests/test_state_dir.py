"""One daemon per state dir (daemon.lock, tier file locks) and private file modes."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentpark.config import Settings
from agentpark.errors import ConfigError
from agentpark.runtime import Runtime
from agentpark.statedir import LOCK_NAME, StateLock
from agentpark.tiers.shm import SHM_DIR_RECORD
from agentpark.tiers.shm import legacy_shm_path as legacy_shm_path
from agentpark.tiers.shm import shm_dir as shm_dir_of
from tests.harness import DaemonProcess, free_port, write_config


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _disk_settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(tiers={"disk": {"capacity": 32 * 4096}})


def test_second_runtime_on_the_same_state_dir_is_refused_with_the_holders_pid(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    first = Runtime.start(settings)
    try:
        assert (settings.state_dir / LOCK_NAME).read_text().strip() == str(os.getpid())
        with pytest.raises(ConfigError) as refused:
            Runtime.start(settings)
        assert f"pid {os.getpid()}" in refused.value.message
        assert str(settings.state_dir) in refused.value.message
    finally:
        first.shutdown()
    # released by a clean shutdown: a new runtime starts on the same state dir
    again = Runtime.start(settings)
    again.shutdown()


def test_the_lock_is_released_when_a_start_fails_after_taking_it(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings()

    def broken(*_args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(Runtime, "_build", classmethod(broken))
    with pytest.raises(RuntimeError):
        Runtime.start(settings)
    StateLock.acquire(settings.state_dir).release()


def test_a_tier_file_in_use_is_refused(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    # Two state dirs, one shm file configured for both: the second is refused, and the
    # first one's file is neither moved aside nor touched.
    first = Runtime.start(make_settings())
    try:
        other = make_settings(state_dir=tmp_path / "other")
        with pytest.raises(ConfigError, match="in use by another agentpark daemon"):
            Runtime.start(other)
        shm = first.parking.tiers["shm"]
        assert list(shm.path.parent.iterdir()) == [shm.path]  # type: ignore[attr-defined]
    finally:
        first.shutdown()
    # the lock on the state dir went with the failed start: that dir is usable now
    StateLock.acquire(tmp_path / "other").release()


def test_the_shm_folder_is_private_unguessable_per_state_dir_and_recorded(
    tmp_path: Path, shm_dir: Path
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    folder = shm_dir_of(a, root=shm_dir)
    assert folder != shm_dir_of(b, root=shm_dir)  # per state dir
    assert shm_dir_of(a / ".." / "a", root=shm_dir) == folder  # recorded, found again
    assert (a / SHM_DIR_RECORD).read_text().strip() == str(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.parent == shm_dir
    assert stat.S_IMODE((a / SHM_DIR_RECORD).stat().st_mode) == 0o600
    # Not derived from the state dir: a new state dir at the same place gets another name.
    shutil.rmtree(a)
    assert shm_dir_of(a, root=shm_dir) != folder


def test_a_shm_folder_replaced_or_opened_up_is_not_used_again(
    tmp_path: Path, shm_dir: Path
) -> None:
    state = tmp_path / "state"
    folder = shm_dir_of(state, root=shm_dir)
    os.chmod(folder, 0o755)
    opened = shm_dir_of(state, root=shm_dir)
    assert opened != folder
    opened.rmdir()
    opened.symlink_to(folder)  # a symlink where the recorded folder was
    assert shm_dir_of(state, root=shm_dir) not in (opened, folder)


def test_an_older_daemons_file_at_the_predictable_name_is_adopted_only_if_ours(
    tmp_path: Path, shm_dir: Path
) -> None:
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    legacy_mine = legacy_shm_path(mine, shm_dir)
    legacy_mine.write_bytes(b"parked bytes")
    os.chmod(legacy_mine, 0o600)
    legacy_theirs = legacy_shm_path(theirs, shm_dir)
    legacy_theirs.symlink_to(tmp_path / "nowhere")
    adopted = shm_dir_of(mine, root=shm_dir) / "shm-tier"
    assert adopted.read_bytes() == b"parked bytes" and not legacy_mine.exists()
    assert not any(shm_dir_of(theirs, root=shm_dir).iterdir())
    assert legacy_theirs.is_symlink()  # left where it is, never followed


def test_state_dir_database_and_tier_files_are_private_under_a_permissive_umask(
    make_settings: Callable[..., Settings], permissive_umask: None
) -> None:
    settings = _disk_settings(make_settings)
    runtime = Runtime.start(settings)
    try:
        with runtime.store._engine.begin() as conn:  # a write: SQLite makes -wal and -shm
            conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS _mode_probe (x)")
        db = settings.state_dir / "agentpark.db"
        assert _mode(settings.state_dir) == 0o700
        assert _mode(settings.state_dir / LOCK_NAME) == 0o600
        for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
            assert path.exists(), path
            assert _mode(path) == 0o600, path
        for tier in ("shm", "disk"):
            path = runtime.parking.tiers[tier].path  # type: ignore[attr-defined]
            assert _mode(path) == 0o600, path
    finally:
        runtime.shutdown()


def test_an_existing_loose_state_dir_and_database_are_tightened(
    make_settings: Callable[..., Settings], permissive_umask: None
) -> None:
    settings = make_settings()
    settings.state_dir.mkdir(mode=0o755)
    os.chmod(settings.state_dir, 0o755)
    db = settings.state_dir / "agentpark.db"
    db.touch()
    os.chmod(db, 0o644)
    runtime = Runtime.start(settings)
    runtime.shutdown()
    assert _mode(settings.state_dir) == 0o700
    assert _mode(db) == 0o600


def test_second_serve_process_on_the_same_state_dir_exits_naming_the_pid(
    make_settings: Callable[..., Settings],
    tmp_path: Path,
    daemon_process: Callable[[Path, int], DaemonProcess],
) -> None:
    settings = make_settings()
    config = write_config(tmp_path / "agentpark.toml", settings)
    first = daemon_process(config, free_port())
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPARK_")}
    cmd = [sys.executable, "-m", "agentpark", "serve", "--config", str(config)]
    second = subprocess.run(
        [*cmd, "--port", str(port)], env=env, capture_output=True, text=True, timeout=120
    )
    assert second.returncode != 0
    assert f"pid {first.proc.pid}" in second.stderr, second.stderr
    assert "Uvicorn running" not in second.stderr  # refused before binding the port
    assert first.client.get("/readyz").status_code == 200  # the first one is untouched
    assert first.stop(signal.SIGTERM) in (0, -signal.SIGTERM)  # uvicorn re-raises it
    # after a clean shutdown the lock is free: a new daemon starts on the same state dir
    again = daemon_process(config, free_port())
    assert again.client.get("/healthz").status_code == 200
    assert again.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
