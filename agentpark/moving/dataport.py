"""The target's data port: a move's blocks over a plain TCP connection, off the HTTP body
path (uvicorn carries a request body at a fifth of what a socket does on one machine).

A connection says ``HELLO`` and a ticket (agentpark.moving.ticket) that an authenticated
batch begin issued, then sends exactly the blocks of the ticket's plan, in its order, each
block's rows of every pool array in turn (the wire form of agentpark.moving.blockio). The
target reads them straight into the reserved slots (``recvmsg_into``, no buffer), checks
each against its digest, and answers with one status (:data:`OK`, ...) and how many blocks
it took. A ticket issued with the batch's imports to commit (``DataOffer.commit``) then
waits for one byte, :data:`COMMIT`: the source asks the batch's commit there instead of in
an HTTP request of its own, having recorded that it asked (agentpark.moving.record). The
target commits them (one SQLite transaction, as the batch commit route does) and answers
the route's body (``BatchCommitAnswer`` JSON, its length first). Then it closes. What the
port guarantees, whoever connects:

- nothing is written to a connection whose ticket is missing, wrong, used or expired (it
  is closed), nor to one past the ``connections`` cap;
- a connection never delivers more than its plan: the reader stops at the plan's last
  byte, so a peer that sends more is closed with its excess unread;
- a peer idle for ``idle_s`` or slower than :data:`MIN_RATE` overall is cut;
- a block counts only once it is verified; a bad one ends the connection;
- nothing is committed but the ticket's imports, only after all of its blocks landed.

Served when the REST API's host is loopback unless configured (``[moves] data``): see
agentpark.config.sections.MoveSettings for why.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from itertools import groupby

from agentpark.errors import AgentparkError
from agentpark.moving.landing import Landing, flat_rows
from agentpark.moving.ticket import HELLO, TICKET_LEN, Grant, Plan, Tickets

__all__ = [
    "ACK",
    "ANSWER_LEN",
    "BAD_BLOCK",
    "COMMIT",
    "GONE",
    "GROUP_BYTES",
    "IOV_MAX",
    "MAX_ANSWER",
    "MIN_RATE",
    "OK",
    "Committer",
    "DataPort",
    "advance",
]

log = logging.getLogger(__name__)

ACK = struct.Struct(">BI")
"""The target's one answer: a status and the blocks it verified and kept."""
OK, BAD_BLOCK, GONE = 0, 1, 2
COMMIT = b"C"
"""The source's one byte after an OK: commit the ticket's imports."""
ANSWER_LEN = struct.Struct(">I")
"""The length of the commit's answer, before it."""
MAX_ANSWER = 2**20
"""The most bytes a commit's answer may be (64 imports' answers are a few KiB)."""
MIN_RATE = 2**20
"""Bytes per second a data connection must average (after ``idle_s`` of grace)."""
IOV_MAX = 1024
GROUP_BYTES = 4 * 2**20
"""Blocks read, then checked, per landing step: what a cut connection loses at most."""

Lookup = Callable[[str], Landing | None]
Committer = Callable[[Sequence[str]], bytes]
"""Commits these imports; the batch commit route's answer body (agentpark.moving.batchin)."""


class _Cut(Exception):
    """The peer closed, went idle or was too slow."""


class DataPort:
    """A listening socket and a thread per admitted connection (at most ``connections``)."""

    def __init__(
        self,
        host: str,
        port: int,
        tickets: Tickets,
        lookup: Lookup,
        connections: int,
        idle_s: float,
    ) -> None:
        self.tickets = tickets
        self.idle_s = idle_s
        self.group_bytes = GROUP_BYTES
        self._lookup = lookup
        # Set by whoever answers the batch commit route (BatchImports): tickets then
        # grant a commit on the connection.
        self.committer: Committer | None = None
        self._slots = threading.BoundedSemaphore(connections)
        self._listener = socket.create_server((host, port), backlog=64)
        self.port: int = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._accepting = threading.Thread(
            target=self._accept, name="agentpark-move-data", daemon=True
        )
        self._accepting.start()

    def close(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accept()
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        self._accepting.join(timeout=5)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                conn.close()  # at the cap: nothing read, nothing written
                continue
            with self._lock:
                self._open.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(self.idle_s)
                hello = bytearray(len(HELLO) + TICKET_LEN)
                deadline = time.monotonic() + self.idle_s
                try:
                    _fill(conn, [memoryview(hello)], deadline)
                except (_Cut, OSError):
                    return
                grant = self.tickets.take(bytes(hello[len(HELLO) :]))
                if not hello.startswith(HELLO) or grant is None:
                    return  # closed having written nothing
                status, taken = self._receive(conn, grant.plan)
                with contextlib.suppress(OSError):
                    conn.sendall(ACK.pack(status, taken))
                    if status == OK:
                        self._commit_asked(conn, grant)
        finally:
            with self._lock:
                self._open.discard(conn)
            self._slots.release()

    def _commit_asked(self, conn: socket.socket, grant: Grant) -> None:
        """Commit the grant's imports if the source asks (:data:`COMMIT`), and answer."""
        if not grant.commit or self.committer is None:
            return
        asked = bytearray(len(COMMIT))
        try:
            _fill(conn, [memoryview(asked)], time.monotonic() + self.idle_s)
        except _Cut:
            return  # the source commits over HTTP, or gave up
        if bytes(asked) != COMMIT:
            return
        try:
            answer = self.committer(grant.commit)
        except Exception:  # the source hears a cut: it asks again, and learns the outcome
            log.exception("a commit asked on the data port failed")
            return
        conn.sendall(ANSWER_LEN.pack(len(answer)) + answer)

    def _receive(self, conn: socket.socket, plan: Plan) -> tuple[int, int]:
        """Land the plan's blocks, a group at a time; (status, blocks taken)."""
        taken = 0
        started = time.monotonic()
        for move_id, entries in groupby(plan, key=lambda e: e[0]):
            landing = self._lookup(move_id)
            rows = None if landing is None else flat_rows(landing.tier)
            if landing is None or rows is None:
                return GONE, taken
            block = sum(n for _, n in rows)
            per = max(1, min(IOV_MAX // len(rows), self.group_bytes // block))
            indices = [i for _, i in entries]
            for at in range(0, len(indices), per):
                group = indices[at : at + per]
                deadline = started + self.idle_s + (taken + len(group)) * block / MIN_RATE

                def read(views: list[memoryview], until: float = deadline) -> None:
                    _fill(conn, views, until)

                try:
                    bad = landing.take_stream(group, rows, read)
                except (_Cut, OSError) as exc:
                    log.info("move %s: data connection cut (%r)", move_id, exc)
                    return GONE, taken
                except AgentparkError as exc:  # given up meanwhile, or a block it has
                    log.warning("move %s: %s", move_id, exc.message)
                    return GONE, taken
                if bad is not None:
                    log.warning("move %s: block %d failed its checksum on arrival", move_id, bad)
                    return BAD_BLOCK, taken + group.index(bad)
                taken += len(group)
        return OK, taken


def _fill(conn: socket.socket, views: list[memoryview], deadline: float) -> None:
    """Read into every view in turn, exactly filling them; _Cut when the peer closes, is
    idle past the socket's timeout or the connection runs past ``deadline``."""
    views = list(views)  # the caller's list stays whole (it hashes the blocks after)
    i = 0
    while i < len(views):
        if time.monotonic() > deadline:
            raise _Cut("too slow")
        try:
            n = conn.recvmsg_into(views[i : i + IOV_MAX])[0]
        except TimeoutError:
            raise _Cut("idle") from None
        if n == 0:
            raise _Cut("closed")
        i = advance(views, i, n)


def advance(views: list[memoryview], i: int, n: int) -> int:
    """After ``n`` more bytes went (from ``views[i]`` on): the first view not done, the
    part of it still to go in its place."""
    while n:
        left = len(views[i])
        if n < left:
            views[i] = views[i][n:]
            return i
        n -= left
        i += 1
    return i
