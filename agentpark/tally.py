"""Event tallies: which events count as a pause, a resume, a recompute or a failed restore,
and what they moved. The core's counters and the host history both count with this."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from agentpark.enums import EventKind

__all__ = ["EventTally", "TalliedEvent", "percentile"]


class TalliedEvent(Protocol):
    @property
    def kind(self) -> str: ...

    @property
    def bytes(self) -> int | None: ...

    @property
    def duration_ms(self) -> float | None: ...


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (``p`` in 0..100); None when there are no values."""
    if not values:
        return None
    return float(np.percentile(values, p, method="inverted_cdf"))


@dataclass
class EventTally:
    """Counts, bytes and copy time of the events added; latencies kept when asked."""

    keep_latencies: bool = False
    pauses: int = 0
    resumes: int = 0
    recomputes: int = 0
    restore_failures: int = 0
    bytes_parked: int = 0
    bytes_restored: int = 0
    park_ms: float = 0.0
    restore_ms: float = 0.0
    pause_ms: list[float] = field(default_factory=list)
    resume_ms: list[float] = field(default_factory=list)  # restores and recomputes

    def add(self, event: TalliedEvent) -> None:
        kind, duration = event.kind, event.duration_ms or 0.0
        if kind == EventKind.PAUSE:
            self.pauses += 1
            self.bytes_parked += event.bytes or 0
            self.park_ms += duration
            if self.keep_latencies:
                self.pause_ms.append(duration)
        elif kind == EventKind.RESUME:
            self.resumes += 1
            self.bytes_restored += event.bytes or 0
            self.restore_ms += duration
            if self.keep_latencies:
                self.resume_ms.append(duration)
        elif kind == EventKind.RECOMPUTE:
            self.recomputes += 1
            if self.keep_latencies:
                self.resume_ms.append(duration)
        elif kind == EventKind.RESTORE_FAILED:
            self.restore_failures += 1
