"""tests/control: the daemon's control socket (server, typed ops, auth), through real sockets.

The daemon's vLLM side is the ``control_daemon`` fixture of tests/connectors (a real
VllmService: SQLite file, /dev/shm pool, unix socket) and the connector's real client.
"""

from __future__ import annotations

from tests.connectors.conftest import ControlDaemon, control_daemon

__all__ = ["ControlDaemon", "control_daemon"]
