"""``agentpark serve`` as a child process, for benches that need daemons as they really run.

Two daemons in threads of one process share its GIL: a move between them measured the
interpreter's contention, not the transfer. Here each daemon is its own process with its
own config file and state dir, and its admin token is made with ``agentpark token create``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

__all__ = ["ServedDaemon", "toml_config"]

ALL_SCOPES = "sessions,operator,admin"


def toml_config(path: Path, sections: dict[str, Any]) -> Path:
    """Write ``sections`` (top-level values, then tables; nested dicts are sub-tables)."""
    lines: list[str] = []
    _table(lines, "", sections)
    path.write_text("\n".join(lines) + "\n")
    return path


def _table(lines: list[str], name: str, values: dict[str, Any]) -> None:
    if name:
        lines.append(f"[{name}]")
    tables = {k: v for k, v in values.items() if isinstance(v, dict)}
    for key, value in values.items():
        if key not in tables:
            lines.append(f"{key} = {_value(value)}")
    for key, value in tables.items():
        _table(lines, f"{name}.{key}" if name else key, value)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


class ServedDaemon:
    """One ``agentpark serve`` on a free loopback port; ready once constructed."""

    def __init__(self, config: Path, ready_timeout_s: float = 600.0) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPARK_")}
        env["PYTHONUNBUFFERED"] = "1"
        self.config = config
        self.token = _cli(["token", "create", "--tenant", "default", "--scope", ALL_SCOPES], config)
        port = _free_port()
        cmd = [sys.executable, "-m", "agentpark", "serve", "--config", str(config)]
        self.url = f"http://127.0.0.1:{port}"
        self.log: list[str] = []
        self.proc = subprocess.Popen(
            [*cmd, "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + ready_timeout_s
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError("the daemon exited:\n" + "".join(self.log[-40:]))
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the daemon was not ready within {ready_timeout_s:g}s")
                time.sleep(0.1)  # polling a child process's port: nothing to wait on

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after 60 s; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=60)
        self._reader.join(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code


def _cli(args: list[str], config: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPARK_")}
    cmd = [sys.executable, "-m", "agentpark", *args, "--config", str(config)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"agentpark {' '.join(args)} failed: {done.stderr}")
    return done.stdout.strip().splitlines()[-1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
