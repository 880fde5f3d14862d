"""Admission to the pool: requests that need blocks take them in arrival order, or wait.

A generate or resume that finds too few free blocks does not fail at once: it joins a
FIFO queue and waits (up to ``admission_timeout_s``) for blocks to be freed by a pause,
a delete, or the idle sessions the head of the queue parks to make room. Only the head
takes blocks, so a later, smaller request never overtakes an earlier one. Waiters sleep on
one condition variable that every free (and every session let go, which may make it
parkable) notifies: no polling.

The daemon's own work (a prefetch) never waits here: it takes blocks only when nobody
waits and they are free now, else it is skipped.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["Admission", "Ticket"]


class Ticket:
    """One request's place in the queue."""

    __slots__ = ("needed",)

    def __init__(self, needed: int) -> None:
        self.needed = needed


class Admission:
    """The FIFO queue in front of the pool's block allocator."""

    def __init__(self, free_blocks: Callable[[], int]) -> None:
        self._free_blocks = free_blocks
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[Ticket] = deque()

    @property
    def waiting(self) -> int:
        """Requests in the queue now (gauge; tests wait on it)."""
        return len(self._queue)

    def notify(self) -> None:
        """Blocks were freed, or a session was let go: waiters look again."""
        with self._cond:
            self._cond.notify_all()

    def now(self, needed: int, take: Callable[[int], list[int]]) -> list[int] | None:
        """``needed`` blocks at once if nobody waits and they are free; else None."""
        with self._cond:
            if self._queue or self._free_blocks() < needed:
                return None
            return take(needed)

    def enter(self, needed: int) -> Ticket:
        ticket = Ticket(needed)
        with self._cond:
            self._queue.append(ticket)
        return ticket

    def leave(self, ticket: Ticket) -> None:
        """Out of the queue (admitted, timed out or failed); the next head looks."""
        with self._cond:
            if ticket in self._queue:
                self._queue.remove(ticket)
            self._cond.notify_all()

    def is_head(self, ticket: Ticket) -> bool:
        with self._cond:
            return bool(self._queue) and self._queue[0] is ticket

    def take(self, ticket: Ticket, take: Callable[[int], list[int]]) -> list[int] | None:
        """The head's blocks if they are free now (it leaves the queue); else None."""
        with self._cond:
            if not self._queue or self._queue[0] is not ticket:
                return None
            if self._free_blocks() < ticket.needed:
                return None
            blocks = take(ticket.needed)
            self._queue.popleft()
            self._cond.notify_all()
            return blocks

    def wait(self, ticket: Ticket, deadline: float) -> bool:
        """Sleep until something changes (or at once if the head's blocks are free).

        False when ``deadline`` (``time.monotonic()``) has passed.
        """
        with self._cond:
            if self._queue and self._queue[0] is ticket and self._free_blocks() >= ticket.needed:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._cond.wait(remaining)
            return True
