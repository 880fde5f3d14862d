"""The connector's side of the control protocol: one socket, bounded waits, never raises.

Every call either returns the daemon's answer or None, and None means "go on as without
agentpark": the daemon is down (``daemon_unreachable``: no connection), slow (``slow``:
connected, but no answer within ``timeout_s``, the scheduler's budget), or refused. Each
such cause is counted, logged once with what was measured (then at debug level), kept in
``last_miss`` for the turn's ``why``, and the counts are sent to the daemon the next time
it answers, so its ``agentpark_vllm_degraded_total`` includes what happened while it was
away.

The socket is found once through ``GET {daemon_url}/v1/vllm`` (stdlib HTTP: this module
loads inside vLLM's processes) and asked again only after the daemon stops answering.

Each connection starts with ``hello``: the token (the daemon decides the tenant from it,
as REST does) and ``peer``, the engine this connector serves, so that the scheduler's
connection and the workers' may finish each other's parks and loads. A ``tenant`` a
call names is not sent: the connection's tenant is its token's.

``generation`` counts the daemons this client has lost: it grows when an established
connection breaks (not when this side drops a slow one) or when a hello names a daemon
instance other than the last one's. What the daemon held for the older generation (pins)
is gone; ``probe`` finds a broken connection without a call (a peek at the socket).
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import socket
import threading
import time
import urllib.request
from typing import Any

from agentpark.connectors.protocol import INSTANCE_RE, ProtocolError, encode_frame, read_frame

__all__ = ["ControlClient"]

log = logging.getLogger(__name__)

_BACKOFF_S = 1.0  # after a failed connect, calls degrade at once for this long
_DISCOVER_TIMEOUT_S = 0.5


class ControlClient:
    """Calls to the daemon's control socket, from one process (thread-safe)."""

    def __init__(
        self,
        daemon_url: str | None,
        *,
        token: str | None = None,
        timeout_s: float = 0.05,
        socket_path: str | None = None,
        who: str = "connector",
        logger: logging.Logger | None = None,
        peer: str | None = None,
    ) -> None:
        self.daemon_url = daemon_url.rstrip("/") if daemon_url else None
        self.token = token
        self.timeout_s = timeout_s
        self.who = who
        self.log = logger or log
        self._path = socket_path
        if peer is not None and not INSTANCE_RE.match(peer):  # any text: a valid name of it
            peer = hashlib.sha256(peer.encode(errors="replace")).hexdigest()[:32]
        self.peer = peer
        # The tenant of the token, as the daemon said it (GET /v1/vllm, then hello).
        self.tenant: str | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._retry_at = 0.0
        self.counts: collections.Counter[str] = collections.Counter()  # all since start
        self._unsent: collections.Counter[str] = collections.Counter()
        self._logged: set[str] = set()
        self.protocol: int | None = None  # the daemon's, from hello
        self.pin_share: float | None = None  # the daemon's bound on pinned blocks (hello)
        self.generation = 0
        self._instance: str | None = None
        # Why the last call got no answer (a turn that was not parked says it).
        self.last_miss = "the agentpark daemon did not answer"

    # ---- degraded -------------------------------------------------------------------------

    def degraded(self, cause: str, why: str) -> None:
        """Count a request served without agentpark; log the first of each cause."""
        self.counts[cause] += 1
        self._unsent[cause] += 1
        self.last_miss = why
        if cause not in self._logged:
            self._logged.add(cause)
            self.log.warning(
                "agentpark %s: %s (%s); vLLM goes on without agentpark for such requests "
                "(counted in agentpark_vllm_degraded_total; logged once per cause)",
                self.who,
                why,
                cause,
            )
        else:
            self.log.debug("agentpark %s: %s (%s)", self.who, why, cause)

    # ---- calls ----------------------------------------------------------------------------

    def call(
        self, op: str, blob: bytes = b"", *, wait_s: float | None = None, **fields: Any
    ) -> dict[str, Any] | None:
        """The daemon's answer (``ok`` true or false), or None when it could not be had.

        ``wait_s``: this call's time-out instead of ``timeout_s`` (registration, which may
        create the pool file, is not on vLLM's scheduling path).
        """
        with self._lock:
            if wait_s is not None and self._sock is not None:
                self._sock.settimeout(wait_s)
            try:
                answer = self._call_locked(op, blob, fields, wait_s)
            finally:
                if wait_s is not None and self._sock is not None:
                    self._sock.settimeout(self.timeout_s)
            if answer is not None and self._unsent and op != "degraded":
                counts, self._unsent = dict(self._unsent), collections.Counter()
                if self._call_locked("degraded", b"", {"counts": counts}, None) is None:
                    self._unsent.update(counts)
            return answer

    def _call_locked(
        self, op: str, blob: bytes, fields: dict[str, Any], wait_s: float | None
    ) -> dict[str, Any] | None:
        started = time.monotonic()
        if started < self._retry_at:
            self.degraded("daemon_unreachable", "the agentpark daemon is not answering")
            return None
        reused = self._sock is not None
        sock = self._sock or self._connect(wait_s, op)
        if sock is None:
            return None
        if wait_s is not None:
            sock.settimeout(wait_s)
        fields.pop("tenant", None)  # the connection's tenant is its token's (hello)
        frame = encode_frame({"op": op, **fields}, blob)
        try:
            try:
                sock.sendall(frame)
                answer, _ = read_frame(sock)
            except (OSError, ProtocolError) as exc:
                if not reused or isinstance(exc, TimeoutError):
                    raise
                # The daemon restarted since this connection was made: one fresh try.
                self._lost()
                sock = self._connect(wait_s, op)
                if sock is None:
                    return None
                if wait_s is not None:
                    sock.settimeout(wait_s)
                sock.sendall(frame)
                answer, _ = read_frame(sock)
        except TimeoutError:
            self._drop()  # a late answer would pair with the next request
            self._too_late(op, started, wait_s)
            return None
        except (OSError, ProtocolError) as exc:
            self._lost()
            self._retry_at = time.monotonic() + _BACKOFF_S
            self.degraded("daemon_unreachable", f"the control connection failed: {exc}")
            return None
        return answer

    def _too_late(self, op: str, started: float, wait_s: float | None) -> None:
        """A connected daemon that did not answer in time: ``slow``, not unreachable."""
        budget = (self.timeout_s if wait_s is None else wait_s) * 1e3
        took = (time.monotonic() - started) * 1e3
        self.degraded(
            "slow", f"the daemon answered {op} too late ({took:.0f} ms > {budget:.0f} ms budget)"
        )

    def _connect(self, wait_s: float | None = None, op: str = "hello") -> socket.socket | None:
        """A new connection, its hello answered within the call's own time-out."""
        started = time.monotonic()
        path = self._path or self._discover()
        if path is None:
            self._retry_at = time.monotonic() + _BACKOFF_S
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout_s if wait_s is None else wait_s)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            self._unreachable(path, exc)
            return None
        try:
            answer = self._hello(sock)
        except TimeoutError:  # connected: the daemon is there, and slow
            sock.close()
            self._too_late(f"{op} (its connection's hello)", started, wait_s)
            return None
        except (OSError, ProtocolError) as exc:
            sock.close()
            self._unreachable(path, exc)
            return None
        if not answer.get("ok"):
            sock.close()
            self._retry_at = time.monotonic() + _BACKOFF_S
            cause = str(answer.get("cause"))
            if cause != "too_many_connections":
                cause = "unauthenticated"
            self.degraded(cause, f"the daemon refused the connection: {answer.get('error')}")
            return None
        self.tenant = str(answer.get("tenant"))
        self.protocol = int(answer.get("protocol") or 0)
        share = answer.get("pin_share")
        self.pin_share = float(share) if isinstance(share, int | float) else None
        instance = answer.get("instance")
        if isinstance(instance, str):
            if self._instance is not None and instance != self._instance:
                self.generation += 1  # a new daemon: the old one's state is gone
            self._instance = instance
        self._sock = sock
        return sock

    def _unreachable(self, path: str, exc: Exception) -> None:
        if self.daemon_url is not None:
            self._path = None  # the daemon may have moved: ask it again next time
        self._retry_at = time.monotonic() + _BACKOFF_S
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        self.degraded("daemon_unreachable", f"cannot connect to {path}: {why}")

    def _hello(self, sock: socket.socket) -> dict[str, Any]:
        """Present the token (once per connection): the daemon's answer."""
        hello: dict[str, Any] = {"op": "hello"}
        if self.token:
            hello["token"] = self.token
        if self.peer:
            hello["peer"] = self.peer
        sock.sendall(encode_frame(hello))
        answer, _ = read_frame(sock)
        return answer

    def _discover(self) -> str | None:
        if self.daemon_url is None:
            self.degraded("not_configured", "no daemon_url in kv_connector_extra_config")
            return None
        request = urllib.request.Request(f"{self.daemon_url}/v1/vllm")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=_DISCOVER_TIMEOUT_S) as response:
                info = json.loads(response.read())
            path = str(info["control_socket"])
            tenant = str(info["tenant"])
        except Exception as exc:  # any failure: the daemon is not there (yet)
            self.degraded("daemon_unreachable", f"GET {self.daemon_url}/v1/vllm failed: {exc}")
            return None
        self._path, self.tenant = path, tenant
        self.log.info("agentpark %s: daemon %s, control socket %s", self.who, self.daemon_url, path)
        return path

    def probe(self) -> int:
        """The generation, after a peek at the connection (no call): a daemon that went
        away closed it, so a readable end of stream means it is lost."""
        with self._lock:
            sock = self._sock
            if sock is None:
                return self.generation
            sock.settimeout(0.0)  # a timeout would make Python wait for the peek
            try:
                data = sock.recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                return self.generation  # open, nothing to read: the daemon is there
            except OSError:
                data = b""
            finally:
                sock.settimeout(self.timeout_s)
            if not data:  # end of stream (or a frame nobody asked for: out of step)
                self._lost()
            return self.generation

    def _lost(self) -> None:
        """An established connection broke: whatever the daemon held for it may be gone."""
        if self._sock is not None:
            self.generation += 1
        self._drop()

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def close(self) -> None:
        with self._lock:
            self._drop()
