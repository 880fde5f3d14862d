"""Helpers of the control tests: a raw connection that sends any frame, and the daemon's
whole state (SQLite rows, live sessions, plans, pool, counts) to compare before and after.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import struct
from pathlib import Path
from typing import Any

from agentpark.connectors.protocol import read_frame
from tests.connectors.conftest import ControlDaemon

__all__ = ["Raw", "state"]


class Raw:
    """A connection to the control socket that sends frames as given (any JSON, NaN too)."""

    def __init__(self, path: Path | str, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))

    def send(self, message: dict[str, Any] | bytes, blob: bytes = b"") -> dict[str, Any]:
        body = message if isinstance(message, bytes) else json.dumps(message).encode()
        self.sock.sendall(struct.pack("<II", len(body), len(blob)) + body + blob)
        answer, _ = read_frame(self.sock)
        return answer

    def hello(self, token: str | None = None, peer: str | None = None) -> dict[str, Any]:
        frame: dict[str, Any] = {"op": "hello"}
        if token is not None:
            frame["token"] = token
        if peer is not None:
            frame["peer"] = peer
        answer = self.send(frame)
        assert answer["ok"], answer
        return answer

    def close(self) -> None:
        self.sock.close()


def state(daemon: ControlDaemon) -> tuple[Any, ...]:
    """Everything a refused request must leave as it was."""
    url = daemon.settings.database_url
    with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
        sessions = db.execute("SELECT * FROM sessions ORDER BY seq").fetchall()
        events = db.execute("SELECT * FROM events ORDER BY rowid").fetchall()
    service = daemon.service
    core = service.driver.core
    live = sorted(
        (r.tenant, r.session_id, r.state, r.tier, r.num_tokens, r.tool, r.expected_resume_at)
        for r in core.live_sessions()
    )
    tier = service.tier
    return (
        sessions,
        events,
        live,
        service.driver.pending(),
        None if tier is None else (tier.used_blocks, id(tier)),
        service.pool_id,
        service.degraded.total(),
        service.driver.turn_ends.pins.figures(),
    )
