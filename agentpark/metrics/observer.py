"""The event observer: counts each committed session transition into the metric families.

A listener of the session core's event log (agentpark.metrics.definitions builds one per
daemon); the counters it increments are declared as a protocol so this module needs none of
the module that defines them.
"""

from __future__ import annotations

import logging
from typing import Protocol

from prometheus_client import Counter, Histogram

from agentpark.enums import EventKind, Reason
from agentpark.store.models import EventRow

log = logging.getLogger(__name__)


def label(value: str | None, default: str) -> str:
    """A label value from an event field: bounded length, never empty."""
    return (value or default)[:32]


class EventCounters(Protocol):
    """The families an event moves (agentpark.metrics.definitions.Metrics has them all)."""

    events: Counter
    pauses: Counter
    resumes: Counter
    recomputes: Counter
    restore_failures: Counter
    lost: Counter
    moves: Counter
    transfer_bytes: Counter
    transfer_seconds: Counter
    bandwidth: Histogram
    pause_seconds: Histogram
    resume_seconds: Histogram


class EventObserver:
    """Counts committed events; remembers corrupt copies until their recompute is counted."""

    def __init__(self, counters: EventCounters, host: str) -> None:
        self.counters = counters
        self.host = host
        # Sessions whose parked copy failed its checksum and whose recompute is not yet
        # counted: that recompute is a fallback for reason "checksum", not the resume's.
        self._corrupt: set[tuple[str, str]] = set()

    def observe(self, event: EventRow) -> None:
        """The event listener: count one committed event (never raises)."""
        try:
            self._count(event)
        except Exception:
            log.exception("metrics: cannot count event %s", event.kind)

    def _count(self, event: EventRow) -> None:
        host, kind = self.host, event.kind
        reason = label(event.reason, "explicit")
        seconds = (event.duration_ms or 0.0) / 1e3
        nbytes = event.bytes or 0
        self.counters.events.labels(host, label(kind, "unknown")).inc()
        if kind == EventKind.PAUSE:
            tier = label(event.to_tier, "unknown")
            self.counters.pauses.labels(host, reason, tier).inc()
            self.counters.pause_seconds.labels(host, tier).observe(seconds)
            self._transfer("park", tier, nbytes, seconds)
        elif kind == EventKind.RESUME:
            source = label(event.from_tier, "pool")
            self.counters.resumes.labels(host, source, reason).inc()
            self.counters.resume_seconds.labels(host, source).observe(seconds)
            if source != "pool":
                self._transfer("restore", source, nbytes, seconds)
        elif kind == EventKind.RECOMPUTE:
            self.counters.resumes.labels(host, "recompute", reason).inc()
            self.counters.resume_seconds.labels(host, "recompute").observe(seconds)
            key = (event.tenant, event.session_id)
            if key in self._corrupt:
                self._corrupt.discard(key)
                reason = Reason.CHECKSUM
            self.counters.recomputes.labels(host, reason).inc()
        elif kind == EventKind.RESTORE_FAILED:
            self.counters.restore_failures.labels(host, label(event.from_tier, "unknown")).inc()
        elif kind == EventKind.CORRUPT:
            # The restore from that tier failed (the copy is dropped, the session LOST);
            # the recompute that follows is counted when its event comes.
            self.counters.restore_failures.labels(host, label(event.from_tier, "unknown")).inc()
            self.counters.lost.labels(host, Reason.CHECKSUM).inc()
            self._corrupt.add((event.tenant, event.session_id))
        elif kind == EventKind.DELETE:
            self._corrupt.discard((event.tenant, event.session_id))
        elif kind == EventKind.LOST:
            self.counters.lost.labels(host, reason).inc()
            if reason == Reason.TIER_FILE_MISSING:  # a parked copy that cannot be restored
                self.counters.restore_failures.labels(host, label(event.from_tier, "unknown")).inc()
        elif kind == EventKind.MOVE:
            src, dst = label(event.from_tier, "unknown"), label(event.to_tier, "unknown")
            self.counters.moves.labels(host, kind, src, dst).inc()
            self._transfer(kind, dst, nbytes, seconds)

    def _transfer(self, direction: str, tier: str, nbytes: int, seconds: float) -> None:
        if nbytes <= 0:
            return
        self.counters.transfer_bytes.labels(self.host, direction, tier).inc(nbytes)
        self.counters.transfer_seconds.labels(self.host, direction, tier).inc(seconds)
        if seconds > 0:
            self.counters.bandwidth.labels(self.host, direction, tier).observe(nbytes / seconds)
