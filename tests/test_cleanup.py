"""``agentpark db cleanup`` on real /dev/shm tier files (in a private folder under /dev/shm,
so other runs' files are never looked at) and on a real daemon's state dir."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from agentpark.blocks import ArraySpec, PoolGeometry
from agentpark.cleanup import (
    IN_USE,
    MOVED,
    ORPHANED,
    OWNER_RUNNING,
    STOPPED,
    find_tier_files,
    run_cleanup,
)
from agentpark.cli import main
from agentpark.config import Settings
from agentpark.statedir import StateLock
from agentpark.tiers.aside import move_aside, staging
from agentpark.tiers.filetier import read_header
from agentpark.tiers.header import HEADER_BYTES, encode_header
from agentpark.tiers.shm import ShmTier
from tests.connectors.conftest import ControlDaemon, control_daemon, control_service  # noqa: F401
from tests.control.test_control import LAYOUT
from tests.harness import InProcessApp

GEOMETRY = PoolGeometry(num_blocks=8, block_size=4, arrays=(ArraySpec((4, 8), "float32"),))
CAPACITY = 8 * GEOMETRY.block_nbytes


def _tier_file(path: Path, owner: Path | None) -> Path:
    """A real shm tier file, closed again (as a stopped daemon leaves it)."""
    ShmTier(path, GEOMETRY, CAPACITY, "model-a", owner).close()
    return path


def test_files_are_classified_and_only_orphans_and_moved_aside_ones_go(
    tmp_path: Path, shm_dir: Path
) -> None:
    gone = tmp_path / "gone-state"
    gone.mkdir()
    stopped = tmp_path / "stopped-state"
    stopped.mkdir()
    running = tmp_path / "running-state"
    orphan = _tier_file(shm_dir / "agentpark-orphan", gone)
    shutil.rmtree(gone)
    kept = _tier_file(shm_dir / "agentpark-stopped", stopped)
    old = _tier_file(shm_dir / "agentpark-old-header", None)
    aside = _tier_file(shm_dir / "agentpark-x.mismatch-123", stopped)
    unused = _tier_file(shm_dir / "agentpark-unused", running)
    nested = shm_dir / "agentpark-bench-1"
    nested.mkdir()
    nested_orphan = _tier_file(nested / "shm-tier.bin", tmp_path / "never-made")
    (shm_dir / "agentpark-not-a-tier").write_bytes(b"hello")
    (shm_dir / "other-prefix").write_bytes(b"AGPKTIER")
    held = ShmTier(shm_dir / "agentpark-held", GEOMETRY, CAPACITY, "model-a", gone)
    lock = StateLock.acquire(running)
    try:
        assert read_header(orphan)["state_dir"] == str(gone.resolve())
        found = {f.path: f.kind for f in find_tier_files((), shm_root=shm_dir)}
        assert found == {
            orphan: ORPHANED,
            kept: STOPPED,
            old: STOPPED,
            aside: MOVED,
            unused: OWNER_RUNNING,
            nested_orphan: ORPHANED,
            held.path: IN_USE,
        }
        lines: list[str] = []
        assert (
            run_cleanup(
                [],
                shm_root=shm_dir,
                dry_run=True,
                yes=False,
                include_stopped=False,
                out=lines.append,
            )
            == 0
        )
        assert all(p.exists() for p in found)  # a dry run removes nothing
        assert (
            f"3 of 7 files to remove, {3 * orphan.stat().st_size / 2**10:.1f} KiB in all" in lines
        )

        lines.clear()
        assert (
            run_cleanup(
                [],
                shm_root=shm_dir,
                dry_run=False,
                yes=False,
                include_stopped=False,
                out=lines.append,
                ask=lambda _q: "n",
            )
            == 0
        )
        assert orphan.exists() and "nothing removed" in lines

        assert (
            run_cleanup(
                [],
                shm_root=shm_dir,
                dry_run=False,
                yes=True,
                include_stopped=False,
                out=lines.append,
            )
            == 0
        )
        assert not orphan.exists() and not aside.exists() and not nested_orphan.exists()
        assert kept.exists() and old.exists() and unused.exists() and held.path.exists()

        assert (
            run_cleanup(
                [],
                shm_root=shm_dir,
                dry_run=False,
                yes=True,
                include_stopped=True,
                out=lines.append,
            )
            == 0
        )
        assert not kept.exists() and not old.exists()
        assert unused.exists() and held.path.exists()  # a live daemon's, never removed
        assert (shm_dir / "agentpark-not-a-tier").exists()
    finally:
        held.close()
        lock.release()


def test_a_running_daemons_tier_files_are_never_removed(
    make_settings: Callable[..., Settings],
    app_factory: Callable[[Settings], InProcessApp],
    tmp_path: Path,
    shm_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = make_settings(tiers={"disk": {"capacity": 32 * 4096}})
    running = app_factory(settings)
    shm_path = settings.tiers.shm.path
    assert shm_path is not None
    disk_path = settings.state_dir / "disk-tier.bin"
    assert read_header(disk_path)["state_dir"] == str(settings.state_dir.resolve())
    config = tmp_path / "agentpark.toml"
    config.write_text(f'state_dir = "{settings.state_dir}"\n[tiers.shm]\npath = "{shm_path}"\n')
    assert (
        main(
            [
                "db",
                "cleanup",
                "--config",
                str(config),
                "--shm-dir",
                str(shm_dir),
                "--yes",
                "--include-stopped",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "0 of 2 files to remove" in out, out
    assert shm_path.exists() and disk_path.exists()
    assert running.runtime.ready.is_set()


def test_every_name_a_file_is_moved_aside_under_is_counted_as_moved_aside(
    tmp_path: Path, shm_dir: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    live = _tier_file(shm_dir / "agentpark-pool", state)
    aside = move_aside(_tier_file(shm_dir / "agentpark-old", state), "test")
    older = _tier_file(shm_dir / "agentpark-x.discarded-1", state)  # an older daemon's name
    crashed = _tier_file(staging(shm_dir / "agentpark-pool"), state)  # register died mid-way
    found = {f.path: f.kind for f in find_tier_files((), shm_root=shm_dir)}
    found.update({f.path: f.kind for f in find_tier_files([shm_dir], shm_root=tmp_path)})
    assert found[aside] == found[older] == found[crashed] == MOVED
    assert found[live] == STOPPED


def _classes(pool: Path) -> dict[Path, tuple[str, str]]:
    return {f.path: (f.kind, f.why) for f in find_tier_files([pool.parent], shm_root=pool.parent)}


def test_a_live_vllm_pool_file_is_named_with_its_model_and_its_owner(
    control_daemon: ControlDaemon,  # noqa: F811
) -> None:
    """Issue 21 item 4: a live vLLM pool file was "no owner in its header"."""
    answer = control_daemon.call("register", layout=LAYOUT.to_wire())
    pool = Path(answer["pool"]["path"])
    owner = control_daemon.settings.state_dir.resolve()
    kind, why = _classes(pool)[pool]
    assert kind == IN_USE
    assert why == f"the vLLM pool of tiny, its owner, the daemon of {owner}, holds its lock"


def test_an_older_daemons_pool_file_names_its_owner_once_a_daemon_re_attaches_it(
    control_daemon: ControlDaemon,  # noqa: F811
) -> None:
    answer = control_daemon.call("register", layout=LAYOUT.to_wire())
    pool = Path(answer["pool"]["path"])
    owner = control_daemon.settings.state_dir.resolve()
    control_daemon.restart()  # re-attached as it was: the pool id a worker knows is kept
    fd = os.open(pool, os.O_RDWR)
    try:  # what a daemon before the owner field wrote (the running daemon's lock aside)
        old = read_header(pool)
        del old["state_dir"], old["version"]
        os.pwrite(fd, encode_header(old, HEADER_BYTES).ljust(HEADER_BYTES, b"\0"), 0)
    finally:
        os.close(fd)
    control_daemon._stop()
    assert _classes(pool)[pool] == (STOPPED, "no owner in its header (an older daemon's)")
    control_daemon.service = control_service(control_daemon.settings, control_daemon.store)
    control_daemon.service.start()
    assert read_header(pool)["state_dir"] == str(owner)
    assert read_header(pool)["created_at"] == old["created_at"]
    again = control_daemon.call("register", layout=LAYOUT.to_wire())
    assert again["pool"]["pool_id"] == answer["pool"]["pool_id"]
    control_daemon._stop()
    kind, why = _classes(pool)[pool]
    assert kind == STOPPED and why == (
        f"the vLLM pool of tiny, no daemon runs on {owner}; a start re-attaches it"
    )
    control_daemon.service = control_service(control_daemon.settings, control_daemon.store)
    control_daemon.service.start()  # the fixture stops it
