"""One-time tickets for the data port: what an authenticated batch begin hands the source
so that one data connection, and only one, may write that batch's missing blocks.

A ticket is ``<id>.<secret>`` (random, 16 + 48 hex digits): the id finds it, the secret is
compared with :func:`hmac.compare_digest` (no timing tells how much of a guess was right).
It is bound to its plan (which blocks of which imports, in order) and to the imports the
connection may commit once its blocks are in (the batch's), good once (taken on the first
connection that shows it) and void after ``ttl_s``.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["HELLO", "TICKET_LEN", "Grant", "Plan", "Tickets"]

HELLO = b"APMV1"
"""The first bytes of a data connection, before its ticket."""
TICKET_LEN = 16 + 1 + 48
_MAX_TICKETS = 256

Plan = list[tuple[str, int]]
"""(move id, block index) of every block a connection carries, in the order it sends them."""


@dataclass(frozen=True)
class Grant:
    """What a good ticket lets its one connection do: send ``plan``, then commit these."""

    plan: Plan
    commit: tuple[str, ...] = ()


@dataclass
class _Ticket:
    secret: str
    grant: Grant
    expires: float


class Tickets:
    """The tickets a target issued and not yet saw used."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._open: dict[str, _Ticket] = {}
        self._lock = threading.Lock()

    def issue(self, plan: Plan, commit: Sequence[str] = ()) -> str:
        ticket_id, secret = secrets.token_hex(8), secrets.token_hex(24)
        now = self.clock()
        with self._lock:
            self._purge(now)
            while len(self._open) >= _MAX_TICKETS:  # the oldest goes: bounded memory
                self._open.pop(next(iter(self._open)))
            self._open[ticket_id] = _Ticket(secret, Grant(plan, tuple(commit)), now + self.ttl_s)
        return f"{ticket_id}.{secret}"

    def take(self, shown: bytes) -> Grant | None:
        """The grant of a good ticket, which is used up; None for anything else (unknown,
        wrong secret, expired, used)."""
        try:
            ticket_id, secret = shown.decode("ascii").split(".", 1)
        except (UnicodeDecodeError, ValueError):
            return None
        with self._lock:
            self._purge(self.clock())
            ticket = self._open.get(ticket_id)
            if ticket is None or not hmac.compare_digest(ticket.secret, secret):
                return None
            del self._open[ticket_id]
            return ticket.grant

    def _purge(self, now: float) -> None:
        for ticket_id in [t for t, ticket in self._open.items() if ticket.expires <= now]:
            del self._open[ticket_id]
