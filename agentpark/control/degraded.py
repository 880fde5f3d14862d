"""Requests a vLLM connector served as without agentpark: a fixed set of causes, counted.

A cause is a metrics label and a key of ``/v1/vllm``'s answer, so it comes from a fixed
enum: whatever a connector (or a frame) names that is not one of them is counted as
``other``. That bounds the Prometheus series (one per cause) and keeps a connector's text
(a lone surrogate, a megabyte of it) out of the daemon's answers.

Counts are kept by tenant too (the tenant of the connection that reported them; ``None``
for the daemon's own, e.g. a plan the engine never reported), so ``/v1/vllm`` can give a
token its own tenant's counts only.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from enum import StrEnum

__all__ = ["DegradedCause", "DegradedCounts", "DegradedSink"]

DegradedSink = Callable[[str, int], None]


class DegradedCause(StrEnum):
    DAEMON_UNREACHABLE = "daemon_unreachable"
    NOT_CONFIGURED = "not_configured"
    TIMEOUT = "timeout"  # connectors before "slow" (an older connector still sends it)
    SLOW = "slow"  # connected, but the answer came after the connector's budget
    UNAUTHENTICATED = "unauthenticated"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    BAD_PARAMS = "bad_params"
    BAD_REQUEST = "bad_request"
    REFUSED = "refused"
    POOL_FULL = "pool_full"
    TIER_FULL = "tier_full"
    SESSION_BUSY = "session_busy"
    INVALID_STATE = "invalid_state"
    LAYOUT_REFUSED = "layout_refused"
    POOL_UNMAPPED = "pool_unmapped"
    LOAD_REFUSED = "load_refused"
    LOAD_CHECKSUM = "load_checksum"
    LOAD_POOL_UNMAPPED = "load_pool_unmapped"
    LOAD_POOL_CHANGED = "load_pool_changed"
    LOAD_FAILED = "load_failed"
    ENGINE_NEVER_REPORTED = "engine_never_reported"
    CONNECTION_CLOSED = "connection_closed"
    SESSION_ID_INVALID = "session_id_invalid"  # vLLM's request.session_id fails our rules
    HINT_IGNORED = "hint_ignored"  # a kv_hints action not agentpark's, or with no session
    HINT_INVALID = "hint_invalid"  # an agentpark kv_hints action refused: nothing parked
    TOOL_CALL_INVALID = "tool_call_invalid"  # a turn's tool-call marker that did not parse
    OTHER = "other"

    @classmethod
    def of(cls, text: object) -> DegradedCause:
        """The cause a text names; ``other`` for anything else (any type, any text)."""
        if isinstance(text, str):
            try:
                return cls(text)
            except ValueError:
                pass
        return cls.OTHER


class DegradedCounts:
    """Counts by (tenant, cause), and the sinks (metrics) told of each (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.Counter[tuple[str | None, DegradedCause]] = collections.Counter()
        self._sinks: list[DegradedSink] = []

    def add_sink(self, sink: DegradedSink) -> None:
        self._sinks.append(sink)

    def count(self, cause: object, n: int = 1, tenant: str | None = None) -> DegradedCause:
        """Count ``n`` requests of ``cause`` (``other`` when it is not a known one)."""
        known = DegradedCause.of(cause)
        with self._lock:
            self._counts[(tenant, known)] += n
        for sink in self._sinks:
            sink(known.value, n)
        return known

    def of_tenant(self, tenant: str) -> dict[str, int]:
        """The counts a tenant's connections reported or caused."""
        with self._lock:
            mine = {c.value: n for (t, c), n in self._counts.items() if t == tenant and n}
        return dict(sorted(mine.items()))

    def total(self) -> dict[str, int]:
        """Every count, the daemon's own and every tenant's, by cause."""
        out: collections.Counter[str] = collections.Counter()
        with self._lock:
            for (_, cause), n in self._counts.items():
                out[cause.value] += n
        return dict(sorted(out.items()))

    def __getitem__(self, cause: str) -> int:
        return self.total().get(cause, 0)
