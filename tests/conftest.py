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
}


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AGENTPARK_* variable of the machine leaks into a test."""
    import os

    for name in list(os.environ):
        if name.startswith("AGENTPARK_"):
            monkeypatch.delenv(name)


@pytest.fixture
def make_settings(tmp_path: Path) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        merged: dict[str, Any] = {"state_dir": tmp_path / "state", **TINY}
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
        return load_settings(None, **merged)

    return make


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


def start_daemon(settings: Settings) -> Daemon:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections queue here until uvicorn accepts: no start-up polling
    port = sock.getsockname()[1]
    app = create_app(settings)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
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
