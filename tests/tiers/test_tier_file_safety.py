"""Tier files that cannot crash or block the daemon (issue 23 item 1), against real daemons.

Each test is a reproducer: before the change a truncated tier file killed the daemon with
SIGBUS at the next access, a planted symlink at the predictable shm path stopped it from
starting, a tier file replaced while running broke its shutdown (EBADF), and a symlink at
the tier's path was followed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from agentpark.config import Settings
from agentpark.tiers.shm import SHM_DIR_RECORD
from tests.harness import DaemonProcess, free_port, wait_until, write_config

PROMPT = {"prompt": "park me somewhere safe", "max_new_tokens": 8}
NOBODY = 65534


def _park(client: httpx.Client, sid: str, tier: str) -> None:
    assert client.post("/v1/sessions", json={"session_id": sid}).status_code == 201
    assert client.post(f"/v1/sessions/{sid}/generate", json=PROMPT).status_code == 200
    parked = client.post(f"/v1/sessions/{sid}/pause", json={"tier": tier, "force": True})
    assert parked.json()["tier"] == tier, parked.text


def _lost_detail(client: httpx.Client, sid: str) -> str:
    events = client.get("/v1/events", params={"session_id": sid}).json()["events"]
    lost = [e for e in events if e["kind"] == "lost"]
    assert lost and lost[0]["reason"] == "tier_file_missing", events
    return str(lost[0]["detail"])


def _stopped_cleanly(proc: DaemonProcess) -> None:
    code = proc.stop(signal.SIGTERM)
    log = "".join(proc.log)
    assert code in (0, -signal.SIGTERM), log[-3000:]
    assert "Bad file descriptor" not in log and "shutdown failed" not in log, log[-3000:]


@pytest.fixture
def start(
    tmp_path: Path, daemon_process: Callable[[Path, int], DaemonProcess]
) -> Callable[[Settings], DaemonProcess]:
    def run(settings: Settings) -> DaemonProcess:
        return daemon_process(write_config(tmp_path / "agentpark.toml", settings), free_port())

    return run


@pytest.mark.parametrize("tier", ["shm", "disk"])
def test_a_truncated_tier_file_loses_its_sessions_and_the_daemon_lives(
    tier: str,
    make_settings: Callable[..., Settings],
    start: Callable[[Settings], DaemonProcess],
    tmp_path: Path,
    shm_dir: Path,
) -> None:
    disk = tmp_path / "disk-tier.bin"
    proc = start(make_settings(tiers={"disk": {"capacity": 32 * 4096, "path": disk}}))
    c = proc.client
    _park(c, "s", tier)
    path = {"shm": shm_dir / "tier", "disk": disk}[tier]
    size = path.stat().st_size
    os.truncate(path, 4096)  # what `truncate -s 4096` does
    resumed = c.post("/v1/sessions/s/resume")
    assert proc.proc.poll() is None, "".join(proc.log)[-3000:]  # no SIGBUS
    assert resumed.status_code == 200 and resumed.json()["restored_from"] == "recompute"
    assert "shrank" in _lost_detail(c, "s")
    metrics = c.get("/metrics").text
    assert 'reason="tier_file_missing"' in metrics
    # The tick remakes the tier: a full-size file at the path again, usable for parks.
    wait_until(lambda: path.exists() and path.stat().st_size == size)
    _park(c, "t", tier)
    assert c.post("/v1/sessions/t/resume").json()["restored_from"] == tier
    _stopped_cleanly(proc)


def test_a_tier_file_replaced_by_a_folder_while_running_still_shuts_down_cleanly(
    make_settings: Callable[..., Settings],
    start: Callable[[Settings], DaemonProcess],
    shm_dir: Path,
) -> None:
    proc = start(make_settings())
    path = shm_dir / "tier"
    old = path.stat().st_ino
    path.unlink()
    path.mkdir()  # what the tick's re-creation finds there
    wait_until(lambda: path.is_file() and path.stat().st_ino != old)  # moved aside, made anew
    _park(proc.client, "s", "shm")
    _stopped_cleanly(proc)


def test_a_removed_tier_file_shuts_down_cleanly(
    make_settings: Callable[..., Settings],
    start: Callable[[Settings], DaemonProcess],
    shm_dir: Path,
) -> None:
    proc = start(make_settings())
    path = shm_dir / "tier"
    old = path.stat().st_ino
    path.unlink()
    wait_until(lambda: path.exists() and path.stat().st_ino != old)
    _stopped_cleanly(proc)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_symlink_at_the_shm_path_is_never_followed_also_after_a_restart(
    make_settings: Callable[..., Settings],
    start: Callable[[Settings], DaemonProcess],
    shm_dir: Path,
    tmp_path: Path,
) -> None:
    settings = make_settings()
    proc = start(settings)
    c = proc.client
    _park(c, "s", "shm")
    path = shm_dir / "tier"
    target = tmp_path / "same-owner-file"
    shutil.copyfile(path, target)  # a file of ours that looks like the tier (same header)
    os.chmod(target, 0o600)
    before = _digest(target)
    link = shm_dir / "link"
    link.symlink_to(target)
    os.replace(link, path)
    assert c.post("/v1/sessions/s/resume").json()["restored_from"] == "recompute"
    assert "symlink" in _lost_detail(c, "s")
    wait_until(lambda: path.exists() and not path.is_symlink())  # made anew, link aside
    _park(c, "t", "shm")
    _stopped_cleanly(proc)
    # Planted again while the daemon is down: the next start does not follow it either.
    path.unlink()
    path.symlink_to(target)
    again = start(settings)
    assert not path.is_symlink() and path.stat().st_ino != target.stat().st_ino
    _park(again.client, "u", "shm")
    assert _digest(target) == before  # never written through the link
    _stopped_cleanly(again)


def _plant_foreign(path: Path) -> None:
    """A file of another user (as root), else a file no daemon may map (mode 0644)."""
    path.write_bytes(b"AGPKTIER not yours")
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY)
    else:
        os.chmod(path, 0o644)


@pytest.fixture
def default_shm_state(tmp_path: Path) -> Iterator[Path]:
    """A state dir whose shm tier uses the default path; its /dev/shm folder (and the
    legacy names planted for it) removed afterwards."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    digest = hashlib.sha256(str(state.resolve()).encode()).hexdigest()[:12]
    legacy = Path("/dev/shm") / f"agentpark-{socket.gethostname()}-{digest}"
    planted = [legacy, legacy.with_name(legacy.name + "-vllm")]
    try:
        yield state
    finally:
        for path in planted:
            path.unlink(missing_ok=True)
        record = state / SHM_DIR_RECORD
        if record.exists():
            shutil.rmtree(record.read_text().strip(), ignore_errors=True)


def test_planted_files_at_every_predictable_path_never_block_a_start(
    make_settings: Callable[..., Settings],
    start: Callable[[Settings], DaemonProcess],
    default_shm_state: Path,
) -> None:
    state = default_shm_state
    digest = hashlib.sha256(str(state.resolve()).encode()).hexdigest()[:12]
    legacy = Path("/dev/shm") / f"agentpark-{socket.gethostname()}-{digest}"
    legacy.symlink_to(legacy.with_name(legacy.name + "-nowhere"))  # dangling
    _plant_foreign(legacy.with_name(legacy.name + "-vllm"))
    (state / "disk-tier.bin").symlink_to(state / "nowhere")  # dangling, in the state dir
    settings = make_settings(
        state_dir=state,
        tiers={"shm": {"capacity": 32 * 4096, "path": None}, "disk": {"capacity": 32 * 4096}},
    )
    proc = start(settings)
    _park(proc.client, "s", "shm")
    _park(proc.client, "d", "disk")
    folder = Path((state / SHM_DIR_RECORD).read_text().strip())
    assert folder.parent == Path("/dev/shm") and folder != legacy
    assert (folder.stat().st_mode & 0o777) == 0o700 and (folder / "shm-tier").is_file()
    assert legacy.is_symlink()  # a stranger's plant is left where it is, never followed
    assert not (state / "disk-tier.bin").is_symlink()
    assert str(folder) in "".join(proc.log)  # the daemon says where its file is
    _stopped_cleanly(proc)
