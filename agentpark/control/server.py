"""The control server: a unix socket in the state dir, frames answered on their own threads.

FastAPI costs about 1.5 ms a call on this kind of machine; the connector asks on vLLM's
scheduling path, so it talks to the daemon over a plain socket instead (frames of
agentpark.connectors.protocol), one thread per connection (a connector process keeps
one connection open). The socket is 0600: only the daemon's user (the engine runs as
the same user, it maps the same /dev/shm pool file) can connect.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentpark.connectors.protocol import ProtocolError, encode_frame, read_frame
from agentpark.errors import ConfigError

__all__ = ["ControlServer", "Handler", "Undelivered", "default_socket_path"]

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any], bytes], tuple[dict[str, Any], bytes]]
Undelivered = Callable[[dict[str, Any], dict[str, Any]], None]
"""(request, answer) whose answer could not be sent: the connector gave up waiting."""
_MAX_SUN_PATH = 100  # sockaddr_un holds 108 bytes on Linux; keep a margin


def default_socket_path(state_dir: Path) -> Path:
    """``<state_dir>/control.sock``, or, where that path is too long for a unix socket, a
    0700 directory of this user's in the temp dir named after the state dir."""
    path = Path(state_dir).resolve() / "control.sock"
    if len(os.fsencode(path)) <= _MAX_SUN_PATH:
        return path
    digest = hashlib.sha256(os.fsencode(Path(state_dir).resolve())).hexdigest()[:12]
    base = Path(os.environ.get("TMPDIR", "/tmp")) / f"agentpark-{os.geteuid()}-{digest}"
    return base / "control.sock"


class ControlServer:
    """Serves ``handler`` on a unix socket at ``path`` until :meth:`stop`."""

    def __init__(
        self, path: Path, handler: Handler, undelivered: Undelivered | None = None
    ) -> None:
        self.path = Path(path)
        self.handler = handler
        self.undelivered = undelivered
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def start(self) -> None:
        if len(os.fsencode(self.path)) > _MAX_SUN_PATH:
            raise ConfigError(f"vllm.control_socket {self.path} is too long for a unix socket")
        parent = self.path.parent
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if parent.stat().st_uid != os.geteuid():
            raise ConfigError(f"{parent} is not owned by this daemon's user")
        # The state lock is held: a socket file left here is a dead daemon's.
        self.path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(64)
        self._sock = sock
        self._thread = threading.Thread(target=self._accept, name="agentpark-control", daemon=True)
        self._thread.start()
        log.info("control socket: %s", self.path)

    def stop(self) -> None:
        self._stopping.set()
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _accept(self) -> None:
        sock = self._sock
        assert sock is not None
        while not self._stopping.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(conn)
            threading.Thread(
                target=self._serve, args=(conn,), name="agentpark-control-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                try:
                    message, blob = read_frame(conn)
                except (ProtocolError, OSError):
                    return
                try:
                    answer, out = self.handler(message, blob)
                except Exception as exc:  # the handler's own bug: answer, keep serving
                    log.exception("control: %s failed", message.get("op"))
                    answer, out = {"ok": False, "error": str(exc)[:500], "cause": "internal"}, b""
                try:
                    conn.sendall(encode_frame(answer, out))
                except OSError:
                    # The connector timed out and closed: it never learns of what was just
                    # reserved for it, so that is undone now (not after plan_timeout_s).
                    if self.undelivered is not None:
                        self.undelivered(message, answer)
                    return
        except OSError:
            return
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()
