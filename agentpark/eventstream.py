"""The committed events of each tenant, fanned out to its event-stream subscribers.

``GET /v1/events/stream`` (agentpark.api.stream) subscribes here. The hub is one of the
session core's event listeners: every committed event is handed, by reference, to the
subscriptions of its tenant and no other. A listener runs in the committing thread, so
:meth:`EventHub.publish` only appends to bounded queues and wakes their event loop; the
event is turned into JSON by the subscriber's own stream.

Bounded everywhere: at most ``max_queue`` events wait for one subscriber (one that falls
further behind is dropped: its stream ends with an ``overflow`` event and the client
resumes from the database with ``Last-Event-ID``), at most ``max_per_tenant`` and
``max_total`` subscriptions exist (more are refused with 429). :meth:`EventHub.close`
(the daemon stops) ends every stream.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Callable

from agentpark.errors import NotReadyError, TooManyStreamsError
from agentpark.store.models import EventRow

__all__ = ["EventHub", "Subscription", "Waiter"]


class Subscription:
    """One subscriber's queue of events, woken on its own event loop."""

    def __init__(self, tenant: str, max_queue: int, loop: asyncio.AbstractEventLoop) -> None:
        self.tenant = tenant
        self.max_queue = max_queue
        self.overflowed = False  # it fell behind: no more events, the stream ends
        self.closed = False  # the daemon stops: the stream ends
        self._events: collections.deque[EventRow] = collections.deque()
        self._lock = threading.Lock()
        self._loop = loop
        self._wake = asyncio.Event()
        self._woken = False  # a wake-up is scheduled and not yet taken

    def push(self, event: EventRow) -> bool:
        """Queue ``event`` (any thread); False once the queue has overflowed."""
        with self._lock:
            if self.closed or self.overflowed:
                return False
            if len(self._events) >= self.max_queue:
                self.overflowed = True
            else:
                self._events.append(event)
        self._signal()
        return not self.overflowed

    def end(self) -> None:
        """No more events: the stream ends after those queued."""
        with self._lock:
            self.closed = True
        self._signal()

    async def wait(self, timeout_s: float) -> list[EventRow]:
        """The events queued, waiting up to ``timeout_s`` for one ([] if none came)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout_s)
        self._wake.clear()
        with self._lock:
            self._woken = False
            taken = list(self._events)
            self._events.clear()
        return taken

    @property
    def finished(self) -> bool:
        """Overflowed or closed: the stream sends what it has taken, then ends."""
        return self.overflowed or self.closed

    def _signal(self) -> None:
        with self._lock:
            if self._woken:
                return
            self._woken = True
        # The loop may have closed (a stream already gone): nothing is waiting then.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._wake.set)


class Waiter:
    """A request waiting for events naming an engine request (``GET /v1/requests/{id}``
    with ``wait_s``): woken, never queued to, so it holds O(1) whatever is committed."""

    def __init__(
        self, tenant: str, match: Callable[[str], bool], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.tenant = tenant
        self.match = match
        self._loop = loop
        self._wake = asyncio.Event()

    def poke(self) -> None:
        with contextlib.suppress(RuntimeError):  # its loop is gone: nobody waits
            self._loop.call_soon_threadsafe(self._wake.set)

    async def wait(self, timeout_s: float) -> None:
        """Until an event naming the request came (since the last wait) or ``timeout_s``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout_s)
        self._wake.clear()


class EventHub:
    """Subscriptions by tenant; :meth:`publish` is the core's event listener."""

    def __init__(self, max_total: int, max_per_tenant: int, max_queue: int) -> None:
        self.max_total = max_total
        self.max_per_tenant = max_per_tenant
        self.max_queue = max_queue
        self.overflows = 0  # subscribers dropped for falling behind
        self._by_tenant: dict[str, set[Subscription]] = {}
        self._waiters: dict[str, set[Waiter]] = {}
        self._count = 0
        self._closed = False
        self._lock = threading.Lock()

    def subscribe(self, tenant: str) -> Subscription:
        """A new subscription of ``tenant`` on the running loop; TooManyStreamsError past
        the limits, NotReadyError once the daemon stops."""
        sub = Subscription(tenant, self.max_queue, asyncio.get_running_loop())
        with self._lock:
            if self._closed:
                raise NotReadyError("the daemon is stopping")
            mine = self._by_tenant.setdefault(tenant, set())
            if len(mine) >= self.max_per_tenant:
                raise TooManyStreamsError(
                    f"this tenant has {len(mine)} event streams open, the most allowed "
                    "(limits.max_streams_per_tenant); close one first",
                    self.max_per_tenant,
                )
            if self._count >= self.max_total:
                raise TooManyStreamsError(
                    f"the daemon serves {self._count} event streams, the most allowed "
                    "(limits.max_streams); retry later",
                    self.max_total,
                )
            mine.add(sub)
            self._count += 1
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            mine = self._by_tenant.get(sub.tenant)
            if mine is None or sub not in mine:
                return
            mine.discard(sub)
            self._count -= 1
            if not mine:
                del self._by_tenant[sub.tenant]

    def waiter(self, tenant: str, match: Callable[[str], bool]) -> Waiter:
        """A waiter for ``tenant``'s events whose request id ``match``es, on this loop."""
        waiter = Waiter(tenant, match, asyncio.get_running_loop())
        with self._lock:
            self._waiters.setdefault(tenant, set()).add(waiter)
        return waiter

    def remove_waiter(self, waiter: Waiter) -> None:
        with self._lock:
            mine = self._waiters.get(waiter.tenant)
            if mine is not None:
                mine.discard(waiter)
                if not mine:
                    del self._waiters[waiter.tenant]

    def publish(self, event: EventRow) -> None:
        """Hand a committed event to its tenant's subscribers (the core's listener)."""
        with self._lock:
            subs = list(self._by_tenant.get(event.tenant, ()))
            waiters = list(self._waiters.get(event.tenant, ())) if event.request_id else []
        for waiter in waiters:
            if event.request_id is not None and waiter.match(event.request_id):
                waiter.poke()
        for sub in subs:
            if not sub.push(event):
                with self._lock:
                    self.overflows += sub.overflowed
                self.unsubscribe(sub)

    def waiting(self, tenant: str) -> int:
        with self._lock:
            return len(self._waiters.get(tenant, ()))

    def subscribers(self, tenant: str | None = None) -> int:
        with self._lock:
            return self._count if tenant is None else len(self._by_tenant.get(tenant, ()))

    def close(self) -> None:
        """The daemon stops: every stream ends, and no new one starts."""
        with self._lock:
            self._closed = True
            subs = [s for mine in self._by_tenant.values() for s in mine]
        for sub in subs:
            sub.end()
