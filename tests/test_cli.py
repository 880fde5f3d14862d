"""The installed command: `agentpark serve` as a real process, `agentpark status` against it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from agentpark import cli


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(state_dir: Path, shm_dir: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPARK_")}
    env["AGENTPARK_STATE_DIR"] = str(state_dir)
    if shm_dir is not None:  # never the default /dev/shm/agentpark-<host>-<hash>
        env["AGENTPARK_TIERS__SHM__PATH"] = str(shm_dir / "tier")
    env["AGENTPARK_POOL__NUM_BLOCKS"] = "32"
    env["PYTHONUNBUFFERED"] = "1"
    return env


STATUS = [sys.executable, "-m", "agentpark", "status"]


def test_serve_status_and_sigterm(tmp_path: Path, shm_dir: Path) -> None:
    port = _free_port()
    env = _env(tmp_path / "state", shm_dir)
    url = f"http://127.0.0.1:{port}"
    # The port comes only from the file, given after the subcommand, to serve and status.
    config = tmp_path / "agentpark.toml"
    config.write_text(f"[server]\nport = {port}\n")
    # A token made before the daemon runs (the CLI works on the database directly).
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentpark",
            "token",
            "create",
            "--config",
            str(config),
            "--tenant",
            "ops",
            "--scope",
            "sessions,operator",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    cmd = [sys.executable, "-m", "agentpark", "serve", "--config", str(config)]
    with subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # blocks until uvicorn reports it is listening
            seen.append(line)
            if "Uvicorn running on" in line:
                break
        # keep draining its log so the daemon never blocks on a full pipe
        rest: list[str] = []
        drain = threading.Thread(target=lambda: rest.append(proc.stderr.read()), daemon=True)
        drain.start()
        try:
            assert proc.poll() is None, "daemon exited early:\n" + "".join(seen)
            assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
            assert (tmp_path / "state" / "agentpark.db").is_file()
            auth = {"Authorization": f"Bearer {token}"}
            created = httpx.post(f"{url}/v1/sessions", json={"session_id": "cli"}, headers=auth)
            assert created.status_code == 201, created.text
            status = subprocess.run(
                [*STATUS, "--config", str(config)],
                env=env | {"COLUMNS": "120", "AGENTPARK_TOKEN": token},
                capture_output=True,
                text=True,
                timeout=60,
            )
            refused = subprocess.run(
                [*STATUS, "--config", str(config), "--token", token[:-1] + "x"],
                env=env | {"COLUMNS": "120", "AGENTPARK_TOKEN": token},  # --token wins
                capture_output=True,
                text=True,
                timeout=60,
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
            drain.join(timeout=10)
    # uvicorn shuts down gracefully, then re-raises SIGTERM (systemd counts that as success)
    assert code in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in "".join(rest)
    assert status.returncode == 0, status.stderr
    assert refused.returncode == 1 and "401" in refused.stdout
    assert "AGENTPARK_TOKEN" in refused.stdout, refused.stdout
    assert "KV pool used" in status.stdout and "0/32 blocks" in status.stdout
    assert "tier dram" in status.stdout and "HBM reclaimed" in status.stdout
    assert f"agentpark at {url}" in status.stdout


def test_status_of_a_daemon_that_is_not_there_fails_clearly(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    out = subprocess.run(
        [sys.executable, "-m", "agentpark", "status", "--url", url],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "did not answer" in out.stdout


def test_bad_config_stops_serve_with_the_key_and_range(tmp_path: Path) -> None:
    env = _env(tmp_path) | {"AGENTPARK_POOL__BLOCK_SIZE": "0"}
    out = subprocess.run(
        [sys.executable, "-m", "agentpark", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "pool.block_size" in out.stderr and "1..4096" in out.stderr


COMMANDS = [
    ["serve"],
    ["db", "upgrade"],
    ["status"],
    ["drain"],
    ["token", "create", "--tenant", "t", "--scope", "sessions"],
    ["token", "list"],
    ["token", "revoke", "abc"],
    ["token", "export"],
    ["token", "import", "f"],
    ["bench", "transfer"],
    ["bench", "resume"],
    ["bench", "agents"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_config_goes_before_or_after_every_subcommand(command: list[str]) -> None:
    parse = cli.build_parser().parse_args
    assert parse(command).config is None
    assert parse(["--config", "a.toml", *command]).config == Path("a.toml")
    assert parse([*command, "--config", "b.toml"]).config == Path("b.toml")
    assert parse(["--config", "a.toml", *command, "--config", "b.toml"]).config == Path("b.toml")
    if len(command) >= 2 and command[0] in ("db", "token", "bench"):  # between group and command
        between = [command[0], "--config", "c.toml", *command[1:]]
        assert parse(between).config == Path("c.toml")


def test_db_upgrade_reads_a_config_given_after_the_subcommand(tmp_path: Path) -> None:
    state = tmp_path / "from-the-file"
    config = tmp_path / "agentpark.toml"
    config.write_text(f'state_dir = "{state}"\n')
    out = subprocess.run(
        [sys.executable, "-m", "agentpark", "db", "upgrade", "--config", str(config)],
        env={k: v for k, v in _env(tmp_path).items() if k != "AGENTPARK_STATE_DIR"},
        cwd=tmp_path,  # without the file, the state would go to ./.agentpark here
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert (state / "agentpark.db").is_file() and "database at head" in out.stdout


def test_drain_of_a_daemon_that_is_not_there_fails_clearly(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    out = subprocess.run(
        [sys.executable, "-m", "agentpark", "drain", "--url", url, "--token", "t"],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and f"drain of {url} failed" in out.stderr
