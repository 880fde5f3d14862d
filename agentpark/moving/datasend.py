"""The source's side of the data port (agentpark.moving.dataport): one connection per
batch, the ticket, then every missing block straight from the tier's mapped arrays
(``sendmsg`` of each block's rows of every pool array: no gather copy, no buffer)."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass

from agentpark.moving.dataport import ACK, BAD_BLOCK, IOV_MAX, OK, advance
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
    address: tuple[str, int], ticket: str, parts: Sequence[Outgoing], timeout_s: float
) -> int:
    """Send ``parts`` in order on one connection; the blocks the target took (all of them,
    or PeerError for a refusal, DataCut for a connection lost on the way)."""
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
            answer = bytearray()
            while len(answer) < ACK.size:
                got = conn.recv(ACK.size - len(answer))
                if not got:
                    raise DataCut("the target closed the data connection without an answer")
                answer += got
    except DataCut:
        raise
    except OSError as exc:
        raise DataCut(f"data connection to {address}: {exc!r}") from exc
    status, taken = ACK.unpack(answer)
    taken = int(taken)
    if status == OK and taken == total:
        return taken
    if status == BAD_BLOCK:
        raise PeerError(f"the target refused a block that failed its checksum ({taken} kept)")
    raise DataCut(f"the target stopped after {taken} of {total} blocks (status {status})")


def _send_all(conn: socket.socket, views: list[memoryview]) -> None:
    i = 0
    while i < len(views):
        i = advance(views, i, conn.sendmsg(views[i : i + IOV_MAX]))
