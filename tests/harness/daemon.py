"""Real daemons: a uvicorn server in a thread of this process, or `agentpark serve` as a
child process.

A ``Daemon`` binds 127.0.0.1, so it has the loopback default (tenant ``default``, no
token) until a test makes a token (``Daemon.token``); admin routes always need one
(``Daemon.admin``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI

from agentpark.app import create_app
from agentpark.auth import Scope
from agentpark.cli.serve import daemon_server
from agentpark.config import Settings
from agentpark.runtime import Runtime
from tests.harness.inprocess import SESSIONS_AND_OPERATOR, bearer, make_token
from tests.harness.wait import wait_until

__all__ = ["Daemon", "DaemonProcess", "free_port", "settled", "start_daemon"]


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

    def token(self, tenant: str = "default", scopes: str = SESSIONS_AND_OPERATOR) -> str:
        """A new token in this daemon's database (from then on every request needs one)."""
        return make_token(self.app, tenant, scopes)

    def admin(self) -> dict[str, str]:
        """A token of tenant default with every scope, sent by ``client`` from now on.

        Admin routes need a token even on loopback, and once one exists every request
        needs one: the test's client keeps acting as tenant default, now with a token.
        """
        headers = bearer(self.token("default", ",".join(s.value for s in Scope)))
        self.client.headers.update(headers)
        return headers

    def stop(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "daemon did not stop"

    def close(self) -> None:
        """After the test: stop it, unless it stopped itself (a drain)."""
        if self.thread.is_alive():
            self.stop()
        else:
            self.client.close()


def start_daemon(settings: Settings, config_path: Path | None = None) -> Daemon:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections queue here until uvicorn accepts: no start-up polling
    port = sock.getsockname()[1]
    app = create_app(settings, config_path, anonymous=True)  # bound to 127.0.0.1 below
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    server = daemon_server(config, app)
    app.state.request_shutdown = lambda: setattr(server, "should_exit", True)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=url, timeout=60)
    daemon = Daemon(settings, url, client, app, server, thread)
    assert client.get("/healthz").status_code == 200
    assert daemon.runtime.ready.wait(timeout=120), "engine warm-up did not finish"
    return daemon


def settled(daemon: Daemon, session_id: str, state: str, tenant: str = "default") -> bool:
    """The session shows ``state`` and no operation holds it any more.

    A background operation (a wait=false copy, the policy loop) sets the session's new state
    a moment before it commits its event and lets go of the session: a test that acts on the
    new state waits for both.
    """
    core = daemon.runtime.parking
    row = core.get(tenant, session_id)
    live = core.registry.find((tenant, session_id))
    return row.state == state and (live is None or not live.busy)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class DaemonProcess:
    """`agentpark serve` as a real child process (for kill -9 and SIGTERM tests)."""

    def __init__(self, config: Path, port: int) -> None:
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

    def reap(self) -> None:
        """After the test: kill it if still running, and close what it holds."""
        if self.proc.poll() is None:
            self.stop(signal.SIGKILL)
        self.client.close()
        self.proc.wait(timeout=60)
        self._drain.join(timeout=10)
        if self.proc.stderr is not None and not self.proc.stderr.closed:
            self.proc.stderr.close()
