"""Shared fixtures: settings on a temporary state dir, and real daemons on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from agentpark.app import create_app
from agentpark.config import Settings, load_settings
from agentpark.runtime import Runtime

# Small and fast: 2-layer model, 64 blocks of 16 tokens, room for 32 parked blocks.
TINY = {
    "model": {"max_seq_len": 512},
    "pool": {"block_size": 16, "num_blocks": 64},
    "tiers": {"dram": {"capacity": 32 * 4096}},
    # No idle parking unless a test asks: a slow machine must not park sessions mid-test.
    "policy": {"idle_pause_after_s": 0, "tick_s": 0.05},
}


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AGENTPARK_* variable of the machine leaks into a test."""
    import os

    for name in list(os.environ):
        if name.startswith("AGENTPARK_"):
            monkeypatch.delenv(name)


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A private directory under /dev/shm (real shared memory), removed afterwards."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="agentpark-test-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_settings(tmp_path: Path, shm_dir: Path) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        tiers = {**TINY["tiers"], "shm": {"capacity": 32 * 4096, "path": shm_dir / "tier"}}
        merged: dict[str, Any] = {"state_dir": tmp_path / "state", **TINY, "tiers": tiers}
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = _merge(merged[key], value)
            else:
                merged[key] = value
        return load_settings(None, **merged)

    return make


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


@dataclass
class Daemon:
    """A real uvicorn server in a thread of this process, on a free loopback port."""

    settings: Settings
    url: str
    client: httpx.Client
    app: FastAPI
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def runtime(self) -> Runtime:
        runtime: Runtime = self.app.state.runtime
        return runtime

    def stop(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "daemon did not stop"


def start_daemon(settings: Settings, config_path: Path | None = None) -> Daemon:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections queue here until uvicorn accepts: no start-up polling
    port = sock.getsockname()[1]
    app = create_app(settings, config_path)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    app.state.request_shutdown = lambda: setattr(server, "should_exit", True)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=url, timeout=60)
    daemon = Daemon(settings, url, client, app, server, thread)
    assert client.get("/healthz").status_code == 200
    assert daemon.runtime.ready.wait(timeout=120), "engine warm-up did not finish"
    return daemon


@pytest.fixture
def daemon_factory() -> Iterator[Callable[[Settings], Daemon]]:
    started: list[Daemon] = []

    def start(settings: Settings) -> Daemon:
        daemon = start_daemon(settings)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        if daemon.thread.is_alive():
            daemon.stop()
        else:  # it stopped itself (a drain)
            daemon.client.close()


@pytest.fixture
def daemon(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> Daemon:
    return daemon_factory(make_settings())


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait for a condition another thread makes true; fail loudly at the deadline."""
    import time

    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s")
        tick.wait(0.005)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class DaemonProcess:
    """`agentpark serve` as a real child process (for kill -9 and SIGTERM tests)."""

    def __init__(self, config: Path, port: int) -> None:
        import os
        import subprocess
        import sys

        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPARK_")}
        env["PYTHONUNBUFFERED"] = "1"
        # --config after the subcommand: what `agentpark serve --config FILE` has to accept
        cmd = [sys.executable, "-m", "agentpark", "serve", "--config", str(config)]
        cmd += ["--port", str(port)]
        self.url = f"http://127.0.0.1:{port}"
        self.log: list[str] = []
        self.proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        for line in self.proc.stderr:  # blocks until uvicorn says it listens
            self.log.append(line)
            if "Uvicorn running on" in line:
                break
        self._drain = threading.Thread(target=self._read_rest, daemon=True)
        self._drain.start()
        assert self.proc.poll() is None, "daemon exited early:\n" + "".join(self.log)
        self.client = httpx.Client(base_url=self.url, timeout=60)
        wait_until(lambda: self.client.get("/readyz").status_code == 200, timeout=120)

    def _read_rest(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self, sig: int) -> int:
        """Send ``sig`` and wait for the process to end; returns its exit code."""
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=120)
        self._drain.join(timeout=10)
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return code


@pytest.fixture
def daemon_process() -> Iterator[Callable[[Path, int], DaemonProcess]]:
    import signal

    started: list[DaemonProcess] = []

    def start(config: Path, port: int) -> DaemonProcess:
        proc = DaemonProcess(config, port)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.proc.poll() is None:
            proc.stop(signal.SIGKILL)
        proc.client.close()
        proc.proc.wait(timeout=60)
        proc._drain.join(timeout=10)
        if proc.proc.stderr is not None and not proc.proc.stderr.closed:
            proc.proc.stderr.close()


def write_config(path: Path, settings: Settings) -> Path:
    """The settings as a TOML file a child process can read."""
    lines = [f'state_dir = "{settings.state_dir}"']
    for section in ("model", "pool", "limits", "integrity", "shutdown", "policy"):
        lines.append(f"[{section}]")
        for key, value in getattr(settings, section).model_dump().items():
            lines.append(f"{key} = {_toml(value)}")
    for tier in ("dram", "shm", "disk"):
        lines.append(f"[tiers.{tier}]")
        for key, value in getattr(settings.tiers, tier).model_dump().items():
            if value is not None:
                lines.append(f"{key} = {_toml(value)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return f'"{value}"'
