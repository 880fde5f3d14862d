"""The host's history: a sampler that writes host samples to SQLite, downsamples, prunes.

Every ``dashboard.sample_interval_s`` the sampler records what the host holds (pool use,
HBM reclaimed, tier use, sessions by state) and what happened since the previous sample
(pauses, resumes, recomputes, restore failures, bytes moved, copy time, latency p50/p99),
read from the events table by id, so nothing committed late is missed or counted twice.

Old samples are merged by ``dashboard.downsample``: rules ``{after_h, step_s}`` from finest
to coarsest, each step a multiple of the one before. A sample older than ``after_h`` hours
goes into the bucket ``[k * step_s, (k + 1) * step_s)`` that holds it, once the whole bucket
is older than that; the merged row's ``at`` is the bucket's start, so a coarser rule later
finds it in its own bucket. Merging averages the gauges (weighted by the raw samples each
row stands for), sums the counts, bytes and milliseconds, takes the count-weighted mean of
p50 and the maximum of p99 (a bound, not an exact percentile). Samples older than
``dashboard.retention_h`` are deleted, a batch per transaction; the same upkeep runs
:class:`agentpark.store.retention.Retention` (old events, tool returns, deleted sessions).

Each step takes an explicit ``now`` so tests drive it without waiting for the clock; the
thread started by :meth:`HostSampler.start` is only a timer around them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from agentpark.config import DashboardSettings
from agentpark.snapshot import HostSnapshot
from agentpark.store.models import HostSampleRow
from agentpark.store.retention import Retention
from agentpark.store.samples import EventFigure, SampleStore
from agentpark.tally import EventTally, percentile

__all__ = [
    "HostSampler",
    "merge_samples",
    "rebucket",
    "sample_to_dict",
    "transfer_figures",
]

log = logging.getLogger(__name__)

HostView = Callable[[], HostSnapshot]

# Downsampling and pruning run at most this often (they are cheap, but not every tick).
MAINTENANCE_EVERY_S = 60.0


def transfer_figures(events: Iterable[EventFigure]) -> dict[str, Any]:
    """Counts, bytes, copy time and latency percentiles of a batch of events.

    Resume latency covers what a resuming agent waits for: copies back from a tier and
    recomputes. Restore bandwidth covers copies only.
    """
    tally = EventTally(keep_latencies=True)
    last_event_id = 0
    for event in events:
        last_event_id = max(last_event_id, event.id)
        tally.add(event)
    return {
        "pauses": tally.pauses,
        "resumes": tally.resumes,
        "recomputes": tally.recomputes,
        "restore_failures": tally.restore_failures,
        "bytes_parked": tally.bytes_parked,
        "bytes_restored": tally.bytes_restored,
        "park_ms": tally.park_ms,
        "restore_ms": tally.restore_ms,
        "last_event_id": last_event_id,
        "pause_p50_ms": percentile(tally.pause_ms, 50),
        "pause_p99_ms": percentile(tally.pause_ms, 99),
        "resume_p50_ms": percentile(tally.resume_ms, 50),
        "resume_p99_ms": percentile(tally.resume_ms, 99),
    }


def bandwidth(nbytes: float, ms: float) -> float | None:
    """Bytes per second while copying; None when nothing was copied."""
    return nbytes / (ms / 1e3) if ms > 0 and nbytes > 0 else None


def merge_samples(rows: Sequence[HostSampleRow], at: float, step_s: float) -> HostSampleRow:
    """One row standing for ``rows`` (see the module docstring for how each field merges)."""
    if not rows:
        raise ValueError("nothing to merge")
    weights = [max(1, r.n) for r in rows]
    total = sum(weights)

    def mean(values: Iterable[float]) -> float:
        return sum(v * w for v, w in zip(values, weights, strict=True)) / total

    tiers: dict[str, dict[str, int]] = {}
    for name in sorted({name for r in rows for name in (r.tiers or {})}):
        having = [(r.tiers[name], max(1, r.n)) for r in rows if name in (r.tiers or {})]
        weight = sum(w for _, w in having)
        tiers[name] = {
            key: round(sum(float(t.get(key, 0)) * w for t, w in having) / weight)
            for key in sorted({k for t, _ in having for k in t})
        }
    states = sorted({state for r in rows for state in (r.sessions or {})})
    sessions = {
        s: round(mean(float((r.sessions or {}).get(s, 0)) for r in rows), 3) for s in states
    }

    def weighted_p50(value: str, counts: Callable[[HostSampleRow], int]) -> float | None:
        having = [(getattr(r, value), counts(r)) for r in rows if getattr(r, value) is not None]
        weight = sum(c for _, c in having)
        if not having:
            return None
        if weight == 0:
            return float(sum(v for v, _ in having) / len(having))
        return float(sum(v * c for v, c in having) / weight)

    def worst(value: str) -> float | None:
        having = [getattr(r, value) for r in rows if getattr(r, value) is not None]
        return max(having) if having else None

    return HostSampleRow(
        at=at,
        step_s=step_s,
        n=total,
        last_event_id=max(r.last_event_id for r in rows),
        pool_total_bytes=round(mean(r.pool_total_bytes for r in rows)),
        pool_used_bytes=round(mean(r.pool_used_bytes for r in rows)),
        reclaimed_bytes=round(mean(r.reclaimed_bytes for r in rows)),
        tiers=tiers,
        sessions=sessions,
        pauses=sum(r.pauses for r in rows),
        resumes=sum(r.resumes for r in rows),
        recomputes=sum(r.recomputes for r in rows),
        restore_failures=sum(r.restore_failures for r in rows),
        bytes_parked=sum(r.bytes_parked for r in rows),
        bytes_restored=sum(r.bytes_restored for r in rows),
        park_ms=sum(r.park_ms for r in rows),
        restore_ms=sum(r.restore_ms for r in rows),
        pause_p50_ms=weighted_p50("pause_p50_ms", lambda r: r.pauses),
        pause_p99_ms=worst("pause_p99_ms"),
        resume_p50_ms=weighted_p50("resume_p50_ms", lambda r: r.resumes + r.recomputes),
        resume_p99_ms=worst("resume_p99_ms"),
    )


def _buckets(rows: Iterable[HostSampleRow], step_s: float) -> dict[float, list[HostSampleRow]]:
    buckets: dict[float, list[HostSampleRow]] = {}
    for row in rows:
        start = math.floor(row.at / step_s) * step_s
        buckets.setdefault(start, []).append(row)
    return buckets


def rebucket(rows: Sequence[HostSampleRow], step_s: float) -> list[HostSampleRow]:
    """Merge ``rows`` into buckets of ``step_s`` for a reader (nothing is written).

    Rows already at least that coarse are passed through unchanged.
    """
    out: list[HostSampleRow] = []
    fine = [r for r in rows if r.step_s < step_s]
    out.extend(r for r in rows if r.step_s >= step_s)
    for start, members in _buckets(fine, step_s).items():
        out.append(members[0] if len(members) == 1 else merge_samples(members, start, step_s))
    out.sort(key=lambda r: r.at)
    return out


def sample_to_dict(row: HostSampleRow) -> dict[str, Any]:
    """A sample as /v1/host/history returns it, with bandwidths worked out."""
    return {
        "at": row.at,
        "step_s": row.step_s,
        "n": row.n,
        "pool_total_bytes": row.pool_total_bytes,
        "pool_used_bytes": row.pool_used_bytes,
        "reclaimed_bytes": row.reclaimed_bytes,
        "tiers": row.tiers or {},
        "sessions": row.sessions or {},
        "pauses": row.pauses,
        "resumes": row.resumes,
        "recomputes": row.recomputes,
        "restore_failures": row.restore_failures,
        "bytes_parked": row.bytes_parked,
        "bytes_restored": row.bytes_restored,
        "park_bytes_per_s": bandwidth(row.bytes_parked, row.park_ms),
        "restore_bytes_per_s": bandwidth(row.bytes_restored, row.restore_ms),
        "pause_p50_ms": row.pause_p50_ms,
        "pause_p99_ms": row.pause_p99_ms,
        "resume_p50_ms": row.resume_p50_ms,
        "resume_p99_ms": row.resume_p99_ms,
    }


class HostSampler:
    """Writes, downsamples and prunes host samples; a thread calls it on a timer."""

    def __init__(
        self,
        host: HostView,
        store: SampleStore,
        settings: DashboardSettings,
        clock: Callable[[], float] = time.time,
        retention: Retention | None = None,
    ) -> None:
        self.host = host
        self.store = store
        self.settings = settings
        self.clock = clock
        self.retention = retention
        latest = store.latest()
        # Continue after the last sample's events; on a first start, count from now on.
        self._last_event_id = latest.last_event_id if latest else store.max_event_id()
        self._lock = threading.Lock()  # sample() from the timer and from a caller
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_maintenance = 0.0

    # ---- the three steps ----------------------------------------------------------------

    def sample(self, now: float | None = None) -> HostSampleRow:
        """Record the host as it is now and the events since the previous sample."""
        now = self.clock() if now is None else now
        with self._lock:
            host = self.host()
            figures = transfer_figures(self.store.events_after(self._last_event_id))
            last_event_id = max(self._last_event_id, figures.pop("last_event_id"))
            tiers = {
                name: {"used_bytes": tier.used_bytes, "capacity_bytes": tier.capacity_bytes}
                for name, tier in host.tiers.items()
            }
            row = HostSampleRow(
                at=now,
                step_s=self.settings.sample_interval_s,
                n=1,
                last_event_id=last_event_id,
                pool_total_bytes=host.pool.total_bytes,
                pool_used_bytes=host.pool.used_bytes,
                reclaimed_bytes=host.reclaimed_bytes,
                tiers=tiers,
                sessions=dict(host.sessions),
                **figures,
            )
            self.store.insert(row)
            self._last_event_id = last_event_id
        return row

    def downsample(self, now: float | None = None) -> int:
        """Merge old samples as the rules say; return how many merged rows were written."""
        now = self.clock() if now is None else now
        written = 0
        with self._lock:
            for rule in self.settings.downsample:
                cutoff = now - rule.after_h * 3600.0
                step = float(rule.step_s)
                old, new = [], []
                for start, members in _buckets(self.store.finer_than(step, cutoff), step).items():
                    if start + step > cutoff:
                        continue  # the bucket is not wholly past the cutoff yet
                    old.extend(members)
                    new.append(merge_samples(members, start, step))
                if new:
                    self.store.replace(old, new)
                    written += len(new)
        return written

    def prune(self, now: float | None = None) -> int:
        """Delete samples older than the retention; return how many."""
        now = self.clock() if now is None else now
        with self._lock:
            return self.store.prune(now - self.settings.retention_h * 3600.0)

    # ---- reading ------------------------------------------------------------------------

    def history(
        self, since: float, until: float, step_s: float | None, max_points: int
    ) -> tuple[float, list[dict[str, Any]]]:
        """Samples in ``[since, until]``, merged to ``step_s`` (chosen when None).

        Returns the step used and the samples. Without a step, the raw resolution is kept
        unless that gives more than ``max_points`` points.
        """
        rows = self.store.between(since, until)
        step = step_s or 0.0
        if not step and len(rows) > max_points:
            step = (until - since) / max_points
        interval = self.settings.sample_interval_s
        if step > interval:
            # A whole number of sampling intervals, so every bucket holds as many samples.
            step = math.ceil(step / interval - 1e-9) * interval
            rows = rebucket(rows, step)
        else:
            step = interval  # never finer than what is stored
        return step, [sample_to_dict(r) for r in rows]

    # ---- the timer ----------------------------------------------------------------------

    def tick(self, now: float | None = None) -> None:
        """One timer tick: a sample, and downsampling and pruning when they are due."""
        now = self.clock() if now is None else now
        self.sample(now)
        if now >= self._next_maintenance:
            # Due again in a minute even if a step fails (a full disk): no retry every tick.
            self._next_maintenance = now + MAINTENANCE_EVERY_S
            self.downsample(now)
            self.prune(now)
            if self.retention is not None:  # outside the lock: samples go on meanwhile
                self.retention.run(now)

    def start(self) -> None:
        """Sample every ``sample_interval_s`` on a daemon thread (the first after one)."""
        if self._thread is not None:
            raise RuntimeError("the sampler is already running")
        self._stop.clear()
        if self.retention is not None:  # a stop does not wait for a backlog to be pruned
            self.retention.should_stop = self._stop.is_set
        self._thread = threading.Thread(target=self._run, name="agentpark-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("host sampler did not stop within %.0fs", timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        interval = self.settings.sample_interval_s
        started = time.monotonic()
        ticks = 0
        failing = False  # an outage (database full, say) is logged once, then its end
        # The first sample is one interval after start, then on a fixed schedule (no
        # drift); a tick that overran skips the slots it missed.
        while not self._stop.wait(max(0.0, started + (ticks + 1) * interval - time.monotonic())):
            ticks += 1
            try:
                self.tick()
            except Exception:
                if not failing:
                    log.exception(
                        "host sample failed; trying every %.1fs, logged again once it works",
                        interval,
                    )
                failing = True
            else:
                if failing:
                    log.info("host samples are recorded again")
                failing = False
            behind = time.monotonic() - (started + (ticks + 1) * interval)
            if behind > 0:
                ticks += math.ceil(behind / interval)
