"""What the daemon's events say about a run of ``agentpark bench agents``: sessions in the
pool over time, byte-seconds of parked KV, pressure parks undone at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["parked_byte_seconds", "pool_timeline", "time_average", "undone_pressure_parks"]

_ENTERS = ("generate", "resume", "recompute", "adopt")
_LEAVES = ("pause", "delete", "lost", "corrupt")


def _start_of(event: dict[str, Any]) -> float:
    return float(event["at"]) - float(event.get("duration_ms") or 0.0) / 1e3


def pool_timeline(events: Sequence[dict[str, Any]], t0: float) -> list[tuple[float, int]]:
    """``(seconds since t0, sessions holding KV in the pool)`` after every change.

    ``events`` are the daemon's (``at`` in epoch seconds), in any order. A session holds KV
    from the start of its first generate or restore (``at`` minus the duration) until a
    pause, delete or loss.
    """
    changes: list[tuple[float, int]] = []
    in_pool: dict[str, bool] = {}
    for e in sorted(events, key=lambda e: (e["session_id"], e["id"])):
        sid, kind = e["session_id"], e["kind"]
        if kind in _ENTERS and not in_pool.get(sid, False):
            in_pool[sid] = True
            changes.append((_start_of(e) - t0, +1))
        elif kind in _LEAVES and in_pool.get(sid, False):
            in_pool[sid] = False
            changes.append((float(e["at"]) - t0, -1))
    timeline: list[tuple[float, int]] = [(0.0, 0)]
    count = 0
    for t, delta in sorted(changes):
        count += delta
        t = max(t, 0.0)
        if t == timeline[-1][0]:
            timeline[-1] = (t, count)
        else:
            timeline.append((t, count))
    return timeline


def parked_byte_seconds(events: Sequence[dict[str, Any]], end: float) -> float:
    """Bytes x seconds of parked KV: from each pause to the start of the restore (or delete).

    ``end`` (epoch seconds) closes an interval that never ended.
    """
    total = 0.0
    parked: dict[str, tuple[float, int]] = {}
    for e in sorted(events, key=lambda e: (e["session_id"], e["id"])):
        sid, kind = e["session_id"], e["kind"]
        if kind == "pause":
            parked[sid] = (float(e["at"]), int(e.get("bytes") or 0))
        elif sid in parked and kind in ("resume", "recompute", "delete", "lost", "corrupt"):
            since, nbytes = parked.pop(sid)
            stop = _start_of(e) if kind in ("resume", "recompute") else float(e["at"])
            total += nbytes * max(0.0, stop - since)
    for since, nbytes in parked.values():
        total += nbytes * max(0.0, end - since)
    return total


def undone_pressure_parks(events: Sequence[dict[str, Any]], within_s: float) -> int:
    """Pressure parks whose session was being restored less than ``within_s`` later.

    Pressure relief parks the least recently used idle session; one that was only idle
    between two calls of its agent comes straight back, and the round trip was wasted.
    """
    undone = 0
    parked_at: dict[str, float] = {}
    for e in sorted(events, key=lambda e: (e["session_id"], e["id"])):
        sid, kind = e["session_id"], e["kind"]
        if kind == "pause":
            if e.get("reason") == "pressure":
                parked_at[sid] = float(e["at"])
            else:
                parked_at.pop(sid, None)
        elif kind in ("resume", "delete") and sid in parked_at:
            since = parked_at.pop(sid)
            undone += kind == "resume" and _start_of(e) - since < within_s
    return undone


def time_average(timeline: Sequence[tuple[float, int]], start: float, end: float) -> float:
    """The time-weighted mean of a step function over [start, end]."""
    if not timeline or not end > start:
        return 0.0
    area = 0.0
    for (t, value), nxt in zip(timeline, [*timeline[1:], (end, 0)], strict=True):
        lo, hi = max(t, start), min(nxt[0], end)
        if hi > lo:
            area += value * (hi - lo)
    return area / (end - start)
