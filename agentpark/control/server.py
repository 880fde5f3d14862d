"""The control server: a unix socket in the state dir, served by one asyncio loop.

FastAPI costs about 1.5 ms a call on this kind of machine; the connector asks on vLLM's
scheduling path, so it talks to the daemon over a plain socket instead (frames of
agentpark.connectors.protocol; a connector process keeps one connection open). The
socket is 0600: only the daemon's user (the engine runs as the same user, it maps the
same /dev/shm pool file) can connect.

Bounds, so that no peer can take the daemon down (see :class:`Limits`): one event loop
reads every connection (an idle connection costs a few KiB, no thread); a new connection
must send its first frame within ``hello_timeout_s`` and, until it is authenticated,
every frame; a frame begun must arrive whole within ``frame_timeout_s``; a frame's bytes
are reserved from ``max_buffered`` (all connections together) before they are read, so a
header announcing a large blob buffers nothing until the budget allows it; past
``max_connections`` a new connection gets a ``too_many_connections`` answer and is closed.
Handlers (SQLite, copies) run on a small thread pool, never on the loop; a connection's
requests are answered one at a time, in order (the protocol is lock step).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentpark.auth import Identity
from agentpark.connectors.protocol import (
    HEAD_SIZE,
    ProtocolError,
    encode_frame,
    parse_body,
    parse_head,
)
from agentpark.errors import ConfigError

__all__ = [
    "Connection",
    "ControlServer",
    "Handler",
    "Limits",
    "Undelivered",
    "default_socket_path",
    "refusal",
]

log = logging.getLogger(__name__)

_MAX_SUN_PATH = 100  # sockaddr_un holds 108 bytes on Linux; keep a margin
_READ_LIMIT = 64 << 10  # the stream's own read-ahead per connection, outside frames


@dataclass
class Connection:
    """One connector's connection: who it is (set by its ``hello``) and whose plans it
    may complete (``owner``)."""

    id: int
    identity: Identity | None = None
    owner: str | None = None
    said_hello: bool = False


Handler = Callable[[Connection, dict[str, Any], bytes], tuple[dict[str, Any], bytes]]
Undelivered = Callable[[Connection, dict[str, Any], dict[str, Any]], None]
"""(connection, request, answer) whose answer could not be sent: the connector gave up."""
Closed = Callable[[Connection], None]


@dataclass(frozen=True)
class Limits:
    """The server's bounds (module doc)."""

    max_connections: int = 1024
    hello_timeout_s: float = 10.0
    frame_timeout_s: float = 10.0
    write_timeout_s: float = 10.0
    max_buffered: int = 64 << 20
    workers: int = 4


def refusal(cause: str, error: str) -> dict[str, Any]:
    """The answer of a request that changed nothing."""
    return {"ok": False, "cause": cause, "error": error[:500]}


def default_socket_path(state_dir: Path) -> Path:
    """``<state_dir>/control.sock``, or, where that path is too long for a unix socket, a
    0700 directory of this user's in the temp dir named after the state dir."""
    path = Path(state_dir).resolve() / "control.sock"
    if len(os.fsencode(path)) <= _MAX_SUN_PATH:
        return path
    digest = hashlib.sha256(os.fsencode(Path(state_dir).resolve())).hexdigest()[:12]
    base = Path(os.environ.get("TMPDIR", "/tmp")) / f"agentpark-{os.geteuid()}-{digest}"
    return base / "control.sock"


class _Budget:
    """Bytes of frames being read, all connections together (asyncio, loop thread only)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._freed = asyncio.Condition()

    async def take(self, n: int) -> None:
        async with self._freed:
            await self._freed.wait_for(lambda: self.used + n <= self.limit)
            self.used += n

    async def give(self, n: int) -> None:
        async with self._freed:
            self.used -= n
            self._freed.notify_all()


class ControlServer:
    """Serves ``handler`` on a unix socket at ``path`` until :meth:`stop`."""

    def __init__(
        self,
        path: Path,
        handler: Handler,
        undelivered: Undelivered | None = None,
        closed: Closed | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.path = Path(path)
        self.handler = handler
        self.undelivered = undelivered
        self.closed = closed
        self.limits = limits or Limits()
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._budget: _Budget | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._tasks: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self.connections = 0

    @property
    def buffered(self) -> int:
        """Bytes of frames reserved now (at most ``limits.max_buffered``)."""
        return 0 if self._budget is None else self._budget.used

    def start(self) -> None:
        if len(os.fsencode(self.path)) > _MAX_SUN_PATH:
            raise ConfigError(f"vllm.control_socket {self.path} is too long for a unix socket")
        parent = self.path.parent
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if parent.stat().st_uid != os.geteuid():
            raise ConfigError(f"{parent} is not owned by this daemon's user")
        # The state lock is held: a socket file left here is a dead daemon's.
        self.path.unlink(missing_ok=True)
        self._pool = ThreadPoolExecutor(self.limits.workers, "agentpark-control")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="agentpark-control")
        self._thread.daemon = True
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), loop).result()
        log.info("control socket: %s", self.path)

    async def _listen(self) -> None:
        self._budget = _Budget(self.limits.max_buffered)
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(
                self._serve, str(self.path), limit=_READ_LIMIT, backlog=1024
            )
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not loop.is_running():
            loop.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _close(self) -> None:
        """Stop accepting, end every connection (its reads see the end), wait for them."""
        if self._server is not None:
            self._server.close()
        for writer in self._tasks.values():
            writer.close()
        tasks = list(self._tasks)
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=5)
            for task in late:
                task.cancel()

    # ---- one connection -----------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self.connections >= self.limits.max_connections:
            answer = refusal(
                "too_many_connections",
                f"the daemon serves {self.limits.max_connections} control connections "
                "already; try again later",
            )
            with contextlib.suppress(Exception):
                writer.write(encode_frame(answer))
                async with asyncio.timeout(1.0):
                    await writer.drain()
            writer.close()
            return
        self._tasks[task] = writer
        self.connections += 1
        conn = Connection(next(self._ids))
        try:
            while await self._one(conn, reader, writer):
                pass
        except (ProtocolError, OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.debug("control connection %d closed: %s", conn.id, exc)
        finally:
            self.connections -= 1
            self._tasks.pop(task, None)
            writer.close()
            if self.closed is not None and self._pool is not None:
                with contextlib.suppress(Exception):
                    await asyncio.get_running_loop().run_in_executor(self._pool, self.closed, conn)

    async def _one(
        self, conn: Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Read, answer and send one frame; False at a clean end of the connection."""
        limits = self.limits
        wait = None if conn.identity is not None else limits.hello_timeout_s
        async with asyncio.timeout(wait):
            first = await reader.read(1)
        if not first:
            return False
        async with asyncio.timeout(limits.frame_timeout_s):
            head = first + await reader.readexactly(HEAD_SIZE - 1)
            try:
                json_len, blob_len = parse_head(head)
                size = json_len + blob_len
                if size > limits.max_buffered:
                    raise ProtocolError(f"a frame of {size} bytes is over the daemon's budget")
            except ProtocolError as exc:  # said, then the connection ends: its rest is unread
                writer.write(encode_frame(refusal("bad_request", f"bad request: {exc}")))
                await writer.drain()
                raise
            budget = self._budget
            assert budget is not None
            await budget.take(size)
            try:
                body = await reader.readexactly(json_len)
                blob = await reader.readexactly(blob_len) if blob_len else b""
            except BaseException:
                await budget.give(size)
                raise
        try:
            answer, out, message = await asyncio.get_running_loop().run_in_executor(
                self._pool, self._answer, conn, body, blob
            )
        finally:
            del body, blob
            await budget.give(size)
        try:
            writer.write(encode_frame(answer, out))
            async with asyncio.timeout(limits.write_timeout_s):
                await writer.drain()
            if writer.transport.is_closing():
                raise ConnectionResetError("closed while the answer was written")
        except (OSError, TimeoutError):
            # The connector timed out and closed: it never learns of what was just
            # reserved for it, so that is undone now (not after plan_timeout_s).
            if self.undelivered is not None and message is not None:
                await asyncio.get_running_loop().run_in_executor(
                    self._pool, self.undelivered, conn, message, answer
                )
            return False
        return True

    def _answer(
        self, conn: Connection, body: bytes, blob: bytes
    ) -> tuple[dict[str, Any], bytes, dict[str, Any] | None]:
        """(answer, blob, the request) on a worker thread; a bad frame is an answer."""
        try:
            message = parse_body(body)
        except ProtocolError as exc:
            return refusal("bad_request", f"bad request: {exc}"), b"", None
        try:
            answer, out = self.handler(conn, message, blob)
        except Exception as exc:  # the handler's own bug: answer, keep serving
            log.exception("control: %s failed", str(message.get("op"))[:32])
            answer, out = refusal("internal", str(exc)), b""
        return answer, out, message
