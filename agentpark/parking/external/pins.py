"""The daemon's record of vLLM's pins, and the pauses it measures from turn end to return.

A pin is the connector's: it keeps a turn's blocks allocated in vLLM (a delayed free)
until the session's next request, the pin's time-out, or pressure, and tells the daemon
with ``unpin``. The daemon records each pin (the session stays ACTIVE, with
``pinned_until`` and ``pinned_blocks`` here) to count and show them, and forgets one at
``pinned_until`` + :data:`GRACE_S` when no ``unpin`` came (the connector died). A daemon
restart forgets every pin; the connector releases its own (its hello answers anew).

Pauses: every turn end (pinned, parked, dropped or kept) opens a wait; the session's next
``match`` closes it with a ``tool_return`` event (its tool in ``detail``, none when the
turn named none), so the pause learned per tool is the agent's own wait, not the wait
plus the next turn's generation. A window of the latest pauses of any tool gives a
global figure for turns whose tool has none (anonymous ones included).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from agentpark.snapshot import PinFigures

__all__ = ["GLOBAL_WINDOW", "GRACE_S", "Pin", "PinFigures", "Pins", "Wait"]

GRACE_S = 10.0
"""How long past a pin's time-out the daemon keeps its record when no unpin comes: the
connector frees a pin at its time-out on its next scheduler step (milliseconds), so 10 s
is a connector that is gone, not one that is late."""

GLOBAL_WINDOW = 256
"""The latest pauses (any tool) behind the global expected pause."""

Key = tuple[str, str]


@dataclass(frozen=True)
class Pin:
    """A session's blocks held in vLLM from ``since`` until ``until`` at the latest."""

    blocks: int
    tokens: int
    since: float  # epoch seconds
    until: float  # epoch seconds: since + the pin's time-out
    expected_s: float | None
    tool: str | None


@dataclass(frozen=True)
class Wait:
    """A turn end's pause, open until the session's next request matches."""

    since: float
    tool: str | None
    last_key: Hashable | None  # an anonymous session's last block key (found by content)


class Pins:
    """Pins and open waits of one daemon, by (tenant, session); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pins: dict[Key, Pin] = {}
        self._waits: dict[Key, Wait] = {}
        self._pauses: collections.deque[float] = collections.deque(maxlen=GLOBAL_WINDOW)
        self._released: collections.Counter[str] = collections.Counter()
        self._answers: collections.Counter[str] = collections.Counter()
        self._tokens_saved = 0
        self._bytes_saved = 0

    # ---- pins ---------------------------------------------------------------------------

    def add(self, key: Key, pin: Pin) -> None:
        with self._lock:
            self._pins[key] = pin

    def get(self, key: Key) -> Pin | None:
        with self._lock:
            return self._pins.get(key)

    def end(self, key: Key, cause: str, tokens_saved: int = 0, bytes_saved: int = 0) -> Pin | None:
        """Forget ``key``'s pin, counted by ``cause``; None when there was none."""
        with self._lock:
            pin = self._pins.pop(key, None)
            if pin is not None:
                self._released[cause] += 1
                self._tokens_saved += tokens_saved
                self._bytes_saved += bytes_saved
            return pin

    def forget(self, key: Key) -> Pin | None:
        """Drop ``key``'s record uncounted (the session was deleted, or turned again)."""
        with self._lock:
            return self._pins.pop(key, None)

    def lapsed(self, now: float | None = None, grace_s: float = GRACE_S) -> list[Key]:
        """The pins past their time-out + ``grace_s`` (still recorded: end them)."""
        at = time.time() if now is None else now
        with self._lock:
            return [k for k, p in self._pins.items() if p.until + grace_s <= at]

    def figures(self) -> PinFigures:
        with self._lock:
            return PinFigures(
                sessions=len(self._pins),
                blocks=sum(p.blocks for p in self._pins.values()),
                released=dict(self._released),
                tokens_saved=self._tokens_saved,
                bytes_saved=self._bytes_saved,
                turn_ends=dict(self._answers),
            )

    def answered(self, answer: str) -> None:
        """Count a turn end's answer (pinned, parked, dropped, kept)."""
        with self._lock:
            self._answers[answer] += 1

    # ---- waits --------------------------------------------------------------------------

    def open_wait(self, key: Key, wait: Wait) -> None:
        with self._lock:
            self._waits[key] = wait

    def waiting(self, key: Key) -> bool:
        with self._lock:
            return key in self._waits

    def keys(self) -> list[Key]:
        """The pinned sessions now."""
        with self._lock:
            return list(self._pins)

    def close_wait(self, key: Key) -> Wait | None:
        with self._lock:
            return self._waits.pop(key, None)

    def waits_of(self, tenant: str) -> bool:
        """Whether ``tenant`` has an open wait an unnamed request could close."""
        with self._lock:
            return any(k[0] == tenant and w.last_key is not None for k, w in self._waits.items())

    def anonymous_wait(self, tenant: str, chain: set[Hashable]) -> Key | None:
        """The tenant's open wait whose last block key is in ``chain`` (the request's)."""
        with self._lock:
            for key, wait in self._waits.items():
                if key[0] == tenant and wait.last_key is not None and wait.last_key in chain:
                    return key
        return None

    def observe(self, seconds: float) -> None:
        with self._lock:
            self._pauses.append(seconds)

    def global_pause(self, quantile: float) -> tuple[float | None, str]:
        """The ``quantile`` of the latest pauses of any tool, and where it comes from."""
        with self._lock:
            seen = list(self._pauses)
        if not seen:
            return None, "no pause measured yet"
        value = float(np.quantile(seen, quantile))
        return value, f"learned: q{quantile:g} of the latest {len(seen)} pauses of any tool"
