"""Two ``agentpark serve`` processes on loopback (A the source, B the target), each with its
own config, state dir and shm tier, and an admin token made with ``agentpark token create``:
the daemons of a move as they really run (no shared interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.harness import DaemonProcess, free_port, write_config
from tests.moving.pair import ALL_SCOPES, pair_settings

__all__ = ["ServedPair", "cli_token", "served_pair"]

Starter = Callable[[Path, int], DaemonProcess]


def cli_token(config: Path) -> str:
    """An admin token (tenant default, every scope), made with the CLI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPARK_")}
    cmd = [sys.executable, "-m", "agentpark", "token", "create", "--config", str(config)]
    cmd += ["--tenant", "default", "--scope", ALL_SCOPES]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.strip().splitlines()[-1]


@dataclass
class ServedPair:
    start: Starter
    configs: dict[str, Path]
    tokens: dict[str, str]
    daemons: dict[str, DaemonProcess] = field(default_factory=dict)

    @property
    def a(self) -> DaemonProcess:
        return self.daemons["a"]

    @property
    def b(self) -> DaemonProcess:
        return self.daemons["b"]

    def serve(self, name: str) -> DaemonProcess:
        """(Re)start daemon ``name`` on its config; its client sends its admin token."""
        daemon = self.start(self.configs[name], free_port())
        daemon.client.headers["Authorization"] = f"Bearer {self.tokens[name]}"
        self.daemons[name] = daemon
        return daemon

    def move(self, session_id: str, *, to: str | None = None) -> httpx.Response:
        """A -> B (or ``to``, a proxy of B) asked of A's REST API with A's admin token."""
        body = {"session_id": session_id, "to": to or self.b.url, "to_token": self.tokens["b"]}
        return self.a.client.post("/v1/moves", json=body, timeout=120)


def served_pair(
    tmp_path: Path,
    shm_dir: Path,
    start: Starter,
    a_overrides: dict[str, Any] | None = None,
    b_overrides: dict[str, Any] | None = None,
) -> ServedPair:
    configs: dict[str, Path] = {}
    tokens: dict[str, str] = {}
    for name, overrides in (("a", a_overrides), ("b", b_overrides)):
        settings = pair_settings(tmp_path, shm_dir, name, **(overrides or {}))
        configs[name] = write_config(tmp_path / f"{name}.toml", settings)
        tokens[name] = cli_token(configs[name])
    pair = ServedPair(start, configs, tokens)
    pair.serve("a")
    pair.serve("b")
    return pair


def park(daemon: DaemonProcess, session_id: str, prompt: str) -> list[int]:
    """A session with ``prompt`` and 20 generated tokens, parked in shm; its tokens."""
    c = daemon.client
    assert c.post("/v1/sessions", json={"session_id": session_id}).status_code == 201
    out = c.post(
        f"/v1/sessions/{session_id}/generate", json={"prompt": prompt, "max_new_tokens": 20}
    )
    assert out.status_code == 200, out.text
    paused = c.post(f"/v1/sessions/{session_id}/pause", json={"tool": "search", "tier": "shm"})
    assert paused.status_code == 200 and paused.json()["state"] == "parked", paused.text
    return list(prompt.encode()) + out.json()["tokens"]
