"""The source's side of the data port (agentpark.moving.dataport): one connection per
batch, the ticket, then every missing block straight from the tier's mapped arrays
(``sendmsg`` of each block's rows of every pool array: no gather copy, no buffer); then,
where the target offered it, the batch's commit asked on the same connection."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentpark.moving.dataport import (
    ACK,
    ANSWER_LEN,
    BAD_BLOCK,
    COMMIT,
    IOV_MAX,
    MAX_ANSWER,
    OK,
    advance,
)
from agentpark.moving.landing import flat_rows
from agentpark.moving.ticket import HELLO
from agentpark.moving.wire import PeerError
from agentpark.tiers.base import HostTier

__all__ = ["DataCut", "Outgoing", "send_blocks"]


class DataCut(OSError):
    """The data connection failed before the target's answer: ask what it still lacks."""


@dataclass
class Outgoing:
    """One session's blocks of a batch to send: its tier, its slots, the indices missing."""

    tier: HostTier
    slots: Sequence[int]
    missing: Sequence[int]


def send_blocks(
    address: tuple[str, int],
    ticket: str,
    parts: Sequence[Outgoing],
    timeout_s: float,
    taken: Callable[[], None],
    before_commit: Callable[[], None] | None = None,
) -> bytes | None:
    """Send ``parts`` in order on one connection, all of which the target must take
    (PeerError for a refusal, DataCut for a connection lost on the way); ``taken`` runs
    once it did. With ``before_commit``, the batch's commit is then asked there, once that
    has run: the target's answer body is returned (a DataCut from then on leaves the
    commit in doubt); else None."""
    total = sum(len(p.missing) for p in parts)
    try:
        with socket.create_connection(address, timeout=timeout_s) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sendall(HELLO + ticket.encode("ascii"))
            for part in parts:
                rows = flat_rows(part.tier)
                if rows is None:
                    raise PeerError(f"the {part.tier.name} tier is not contiguous")
                views = [
                    view[part.slots[i] * n : (part.slots[i] + 1) * n]
                    for i in part.missing
                    for view, n in rows
                ]
                _send_all(conn, views)
            status, verified = ACK.unpack(_read(conn, ACK.size))
            _check(int(status), int(verified), total)
            taken()
            if before_commit is None:
                return None
            before_commit()
            conn.sendall(COMMIT)
            (size,) = ANSWER_LEN.unpack(_read(conn, ANSWER_LEN.size))
            if size > MAX_ANSWER:
                raise DataCut(f"the target's commit answer is {size} bytes, past {MAX_ANSWER}")
            return _read(conn, size)
    except (DataCut, PeerError):
        raise
    except OSError as exc:
        raise DataCut(f"data connection to {address}: {exc!r}") from exc


def _check(status: int, taken: int, total: int) -> None:
    if status == OK and taken == total:
        return
    if status == BAD_BLOCK:
        raise PeerError(f"the target refused a block that failed its checksum ({taken} kept)")
    raise DataCut(f"the target stopped after {taken} of {total} blocks (status {status})")


def _read(conn: socket.socket, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        chunk = conn.recv(n - len(got))
        if not chunk:
            raise DataCut("the target closed the data connection without an answer")
        got += chunk
    return bytes(got)


def _send_all(conn: socket.socket, views: list[memoryview]) -> None:
    i = 0
    while i < len(views):
        i = advance(views, i, conn.sendmsg(views[i : i + IOV_MAX]))
