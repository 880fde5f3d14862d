"""Failed authentication costs the caller: a per-peer leaky bucket of 401s, then 429.

Each request refused 401 (no token where one is needed, a malformed, unknown or revoked
one) adds one to its peer's bucket, which drains at ``auth.failure_rate_per_s``. Once a
peer's bucket holds ``auth.failure_burst``, its next failures are answered 429
``auth_throttled`` with ``Retry-After`` (the seconds until the bucket has room again), and
are not added: a client that waits as told gets its 401 again. Only failures are looked
at, after the token check: a valid token from a throttled peer passes, and a peer that
never fails never enters the table.

Peers are the client's IP address (all of loopback is one peer). The table holds at most
``auth.max_peers`` of them; past that the peer whose last failure is oldest is forgotten,
so a flood from many addresses costs bounded memory (each forgotten peer starts afresh).

Every failure is counted in ``agentpark_auth_failures_total{answer}``: ``unauthenticated``
(answered 401) or ``throttled`` (answered 429).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["AuthLimiter"]


class AuthLimiter:
    """The per-peer table of failed authentications (see the module doc)."""

    def __init__(
        self,
        burst: int,
        rate_per_s: float,
        max_peers: int,
        *,
        count: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.rate_per_s = rate_per_s
        self.max_peers = max_peers
        self._count = count
        self._clock = clock
        # peer -> (failures still in the bucket, when that was computed); oldest first.
        self._peers: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._peers)

    def failed(self, peer: str) -> float | None:
        """Record a failed authentication of ``peer``: None (answer 401) or the seconds to
        put in ``Retry-After`` (answer 429)."""
        now = self._clock()
        with self._lock:
            level, then = self._peers.pop(peer, (0.0, now))
            level = max(0.0, level - (now - then) * self.rate_per_s)
            retry_after: float | None = None
            if level + 1.0 > self.burst:
                retry_after = (level + 1.0 - self.burst) / self.rate_per_s
            else:
                level += 1.0
            self._peers[peer] = (level, now)  # the newest at the end
            while len(self._peers) > self.max_peers:
                self._peers.popitem(last=False)
        if self._count is not None:
            self._count("unauthenticated" if retry_after is None else "throttled")
        return retry_after
