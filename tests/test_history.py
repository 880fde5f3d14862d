"""The host sampler: samples written, downsampled and pruned as configured.

Every step is driven with an explicit ``now`` (no waiting for the clock), against a real
SQLite file brought to head by the migrations, with events written by the real store.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentpark.config import DashboardSettings, load_settings
from agentpark.errors import ConfigError
from agentpark.history import HostSampler, merge_samples
from agentpark.snapshot import Counters, HostSnapshot, PoolFigures, TierFigures
from agentpark.store.db import open_database
from agentpark.store.migrate import upgrade
from agentpark.store.models import EventRow
from agentpark.store.repository import SessionStore
from agentpark.store.samples import SampleStore
from agentpark.tally import percentile
from tests.harness import session_row, wait_until

T0 = 1_800_000_000.0  # a multiple of 600 and of 60: buckets start on it
HOUR = 3600.0


class FakeHost:
    """A host snapshot whose figures the test sets (what the session core reports)."""

    def __init__(self) -> None:
        self.reclaimed = 0
        self.used = 0
        self.sessions = {"active": 0, "parked": 0}
        self.dram_used = 0

    def __call__(self) -> HostSnapshot:
        total, block = 1_000_000, 1000
        return HostSnapshot(
            ready=True,
            model_uid="m",
            dma_backend="host_copy",
            listen="127.0.0.1:0",
            pool=PoolFigures(
                total_blocks=total // block,
                used_blocks=self.used // block,
                free_blocks=(total - self.used) // block,
                block_size_tokens=16,
                block_bytes=block,
                total_bytes=total,
                used_bytes=self.used,
                free_bytes=total - self.used,
            ),
            reclaimed_bytes=self.reclaimed,
            tiers={
                "dram": TierFigures(
                    persistent=False,
                    capacity_blocks=500,
                    used_blocks=self.dram_used // block,
                    capacity_bytes=500_000,
                    used_bytes=self.dram_used,
                )
            },
            sessions=dict(self.sessions),
            draining=False,
            counters=Counters(),
        )


class Stores:
    def __init__(self, url: str) -> None:
        engine, factory = open_database(url)
        self.sessions = SessionStore(engine, factory)
        self.samples = SampleStore(engine, factory)
        self.row = session_row(created_at=T0, last_active_at=T0)
        self.sessions.insert(self.row, self._event("create"))

    def _event(self, kind: str, **fields: Any) -> EventRow:
        return EventRow(tenant="t", session_id="s", kind=kind, at=T0, reason="explicit", **fields)

    def event(self, kind: str, ms: float, nbytes: int = 0, tier: str = "dram") -> None:
        from_tier = None if kind == "pause" else tier
        to_tier = tier if kind == "pause" else None
        self.sessions.save(
            self.row,
            self._event(kind, duration_ms=ms, bytes=nbytes, from_tier=from_tier, to_tier=to_tier),
        )


@pytest.fixture
def stores(tmp_path: Path) -> Stores:
    url = f"sqlite:///{tmp_path / 'agentpark.db'}"
    upgrade(url)
    return Stores(url)


@pytest.fixture
def make_sampler(stores: Stores) -> Callable[..., tuple[HostSampler, FakeHost]]:
    def make(**dashboard: Any) -> tuple[HostSampler, FakeHost]:
        host = FakeHost()
        settings = DashboardSettings(**dashboard)
        return HostSampler(host, stores.samples, settings, clock=_no_clock), host

    return make


def _no_clock() -> float:
    raise AssertionError("the test passes now explicitly")


# ---- sampling -----------------------------------------------------------------------------


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0
    values = [float(v) for v in range(1, 11)]  # 1..10
    assert percentile(values, 50) == 5.0
    assert percentile(values, 99) == 10.0
    assert percentile(list(reversed(values)), 90) == 9.0


def test_sample_records_the_host_and_the_events_since_the_previous_one(
    stores: Stores, make_sampler: Callable[..., tuple[HostSampler, FakeHost]]
) -> None:
    stores.event("pause", 999.0, 1)  # before the sampler existed: not its business
    sampler, host = make_sampler(sample_interval_s=10)
    host.used, host.reclaimed, host.dram_used = 300_000, 200_000, 200_000
    host.sessions = {"active": 2, "parked": 1}
    for ms in range(1, 11):
        stores.event("pause", float(ms), 100)
    stores.event("resume", 5.0, 100)
    stores.event("resume", 7.0, 100)
    stores.event("recompute", 50.0, 100, tier="")
    stores.event("restore_failed", 1.0)
    stores.event("generate", 3.0)  # not a figure

    row = sampler.sample(now=T0 + 10)
    assert (row.at, row.step_s, row.n) == (T0 + 10, 10.0, 1)
    assert (row.pool_total_bytes, row.pool_used_bytes, row.reclaimed_bytes) == (
        1_000_000,
        300_000,
        200_000,
    )
    assert row.tiers == {"dram": {"used_bytes": 200_000, "capacity_bytes": 500_000}}
    assert row.sessions == {"active": 2, "parked": 1}
    assert (row.pauses, row.resumes, row.recomputes, row.restore_failures) == (10, 2, 1, 1)
    assert (row.bytes_parked, row.bytes_restored) == (1000, 200)
    assert (row.park_ms, row.restore_ms) == (55.0, 12.0)
    assert (row.pause_p50_ms, row.pause_p99_ms) == (5.0, 10.0)
    # Resume latency is what a resuming agent waits for: copies and recomputes.
    assert (row.resume_p50_ms, row.resume_p99_ms) == (7.0, 50.0)

    quiet = sampler.sample(now=T0 + 20)
    assert (quiet.pauses, quiet.resumes, quiet.bytes_parked, quiet.park_ms) == (0, 0, 0, 0.0)
    assert quiet.pause_p50_ms is None and quiet.resume_p99_ms is None
    assert quiet.last_event_id == row.last_event_id

    # A restarted daemon's sampler goes on after the last sample's events.
    stores.event("pause", 4.0, 100)
    again, _ = make_sampler(sample_interval_s=10)
    assert again.sample(now=T0 + 30).pauses == 1
    assert stores.samples.count() == 3


def test_history_returns_the_samples_of_the_window_with_bandwidth(
    stores: Stores, make_sampler: Callable[..., tuple[HostSampler, FakeHost]]
) -> None:
    sampler, host = make_sampler(sample_interval_s=10)
    for k in range(12):
        host.reclaimed = 1000 * k
        stores.event("pause", 2.0, 4_000_000)  # 4 MB in 2 ms: 2 GB/s
        sampler.sample(now=T0 + 10 * k)
    step, samples = sampler.history(T0 + 20, T0 + 50, None, 1000)
    assert step == 10.0
    assert [s["at"] for s in samples] == [T0 + 20, T0 + 30, T0 + 40, T0 + 50]
    assert [s["reclaimed_bytes"] for s in samples] == [2000, 3000, 4000, 5000]
    assert samples[0]["park_bytes_per_s"] == pytest.approx(2e9)
    assert samples[0]["restore_bytes_per_s"] is None

    # A step is rounded up to whole sampling intervals and merges on the fly.
    step, merged = sampler.history(T0, T0 + 110, 25, 1000)
    assert step == 30.0
    assert [s["at"] for s in merged] == [T0, T0 + 30, T0 + 60, T0 + 90]
    assert [s["n"] for s in merged] == [3, 3, 3, 3]
    assert merged[1]["reclaimed_bytes"] == 4000  # mean of 3000, 4000, 5000
    assert merged[1]["pauses"] == 3
    assert stores.samples.count() == 12  # reading writes nothing

    # Too many points for the reader: a coarser step is chosen.
    step, few = sampler.history(T0, T0 + 110, None, 4)
    assert step == 30.0 and len(few) == 4


# ---- downsampling and pruning ---------------------------------------------------------


def _fill(sampler: HostSampler, host: FakeHost, stores: Stores, count: int) -> None:
    """``count`` raw samples 10 s apart from T0; sample k has reclaimed = 10 k, one pause."""
    for k in range(count):
        host.reclaimed = 10 * k
        host.sessions = {"active": k % 3, "parked": 1}
        stores.event("pause", float(k % 7 + 1), 1000)
        sampler.sample(now=T0 + 10 * k)


def test_downsample_merges_whole_buckets_past_each_cutoff(
    stores: Stores, make_sampler: Callable[..., tuple[HostSampler, FakeHost]]
) -> None:
    sampler, host = make_sampler(
        sample_interval_s=10,
        retention_h=48,
        downsample=[{"after_h": 1, "step_s": 60}, {"after_h": 24, "step_s": 600}],
    )
    _fill(sampler, host, stores, 720)  # two hours: T0 .. T0 + 7190
    raw = list(stores.samples.between(T0, T0 + 2 * HOUR))
    assert len(raw) == 720

    # Two hours in, the first hour goes to 60 s buckets, except the bucket the cutoff
    # cuts through (it waits until it is wholly past).
    now = T0 + 2 * HOUR + 30  # cutoff T0 + 3630: the bucket [3600, 3660) is not complete
    assert sampler.downsample(now) == 60
    rows = list(stores.samples.between(T0, now))
    merged = [r for r in rows if r.step_s == 60]
    assert len(merged) == 60 and len(rows) == 60 + 360
    assert [r.at for r in merged] == [T0 + 60 * j for j in range(60)]
    first = merged[0]  # raw samples 0..5
    assert first.n == 6
    assert first.reclaimed_bytes == 25  # mean of 0, 10, .., 50
    assert first.sessions == {"active": 1.0, "parked": 1.0}  # mean of 0,1,2,0,1,2
    assert first.pauses == 6 and first.bytes_parked == 6000
    assert first.park_ms == sum(k % 7 + 1 for k in range(6))
    assert first.pause_p99_ms == 6.0  # the worst of its members
    assert first.pause_p50_ms == pytest.approx(sum(k % 7 + 1 for k in range(6)) / 6)
    assert first.last_event_id == max(r.last_event_id for r in raw[:6])
    assert first.tiers == {"dram": {"capacity_bytes": 500_000, "used_bytes": 0}}
    assert min(r.at for r in rows if r.step_s == 10) == T0 + 3600

    # Nothing left to do at the same time; a later call takes the finished bucket.
    assert sampler.downsample(now) == 0
    assert sampler.downsample(T0 + 2 * HOUR + 60) == 1

    # A day later the 60 s buckets of the first hour go to 600 s ones, the rest to 60 s.
    later = T0 + 25 * HOUR
    sampler.downsample(later)
    rows = list(stores.samples.between(T0, later))
    assert [r.at for r in rows if r.step_s == 600] == [T0 + 600 * j for j in range(6)]
    assert [r.at for r in rows if r.step_s == 60] == [T0 + 3600 + 60 * j for j in range(60)]
    assert len(rows) == 66
    coarse = rows[0]
    assert coarse.n == 60 and coarse.pauses == 60
    assert coarse.reclaimed_bytes == 295  # mean of 0..590
    # Nothing is lost on the way: counts, bytes and copy time add up, weights too.
    assert sum(r.n for r in rows) == 720
    assert sum(r.pauses for r in rows) == 720
    assert sum(r.bytes_parked for r in rows) == 720 * 1000
    assert sum(r.park_ms for r in rows) == sum(k % 7 + 1 for k in range(720))
    assert max(r.pause_p99_ms or 0 for r in rows) == 7.0


def test_prune_deletes_samples_past_the_retention(
    stores: Stores, make_sampler: Callable[..., tuple[HostSampler, FakeHost]]
) -> None:
    sampler, host = make_sampler(sample_interval_s=10, retention_h=1, downsample=[])
    _fill(sampler, host, stores, 720)
    assert sampler.prune(T0 + 2 * HOUR) == 360  # older than T0 + 3600
    assert sampler.prune(T0 + 2 * HOUR) == 0
    left = stores.samples.between(0, T0 + 3 * HOUR)
    assert len(left) == 360 and left[0].at == T0 + HOUR


def test_tick_samples_and_maintains_when_due(
    stores: Stores, make_sampler: Callable[..., tuple[HostSampler, FakeHost]]
) -> None:
    sampler, host = make_sampler(
        sample_interval_s=10, retention_h=2, downsample=[{"after_h": 1, "step_s": 60}]
    )
    _fill(sampler, host, stores, 360)  # T0 .. T0 + 3590
    sampler.tick(T0 + 3 * HOUR)  # prunes everything before T0 + 1 h, samples now
    rows = stores.samples.between(0, T0 + 4 * HOUR)
    assert [r.at for r in rows] == [T0 + 3 * HOUR]


def test_merge_keeps_tiers_seen_in_some_members_only() -> None:
    from agentpark.store.models import HostSampleRow

    def row(at: float, tiers: dict[str, Any], p50: float | None, pauses: int) -> HostSampleRow:
        return HostSampleRow(
            at=at,
            step_s=10.0,
            n=1,
            last_event_id=int(at),
            pool_total_bytes=100,
            pool_used_bytes=10,
            reclaimed_bytes=5,
            tiers=tiers,
            sessions={"active": 1},
            pauses=pauses,
            resumes=0,
            recomputes=0,
            restore_failures=0,
            bytes_parked=0,
            bytes_restored=0,
            park_ms=0.0,
            restore_ms=0.0,
            pause_p50_ms=p50,
            pause_p99_ms=p50,
            resume_p50_ms=None,
            resume_p99_ms=None,
        )

    a = row(0, {"dram": {"used_bytes": 10, "capacity_bytes": 100}}, 2.0, 1)
    b = row(
        10, {"dram": {"used_bytes": 30, "capacity_bytes": 100}, "shm": {"used_bytes": 8}}, None, 0
    )
    c = row(20, {"dram": {"used_bytes": 20, "capacity_bytes": 100}}, 8.0, 3)
    m = merge_samples([a, b, c], 0.0, 60.0)
    assert m.tiers == {
        "dram": {"used_bytes": 20, "capacity_bytes": 100},
        "shm": {"used_bytes": 8},  # a tier that appeared: averaged where it was present
    }
    assert m.pause_p50_ms == pytest.approx((2.0 * 1 + 8.0 * 3) / 4)
    assert m.pause_p99_ms == 8.0 and m.resume_p50_ms is None
    assert (m.at, m.step_s, m.n, m.last_event_id) == (0.0, 60.0, 3, 20)
    with pytest.raises(ValueError):
        merge_samples([], 0.0, 60.0)


# ---- the timer thread -------------------------------------------------------------------


def test_sampler_thread_samples_on_its_own_and_stops(stores: Stores) -> None:
    host = FakeHost()
    sampler = HostSampler(
        host, stores.samples, DashboardSettings(sample_interval_s=0.1, downsample=[])
    )
    sampler.start()
    try:
        with pytest.raises(RuntimeError):
            sampler.start()
        wait_until(lambda: stores.samples.count() >= 3)
    finally:
        sampler.stop()
    assert not sampler.running
    rows = stores.samples.between(0, 1e12)
    assert all(b.at > a.at for a, b in itertools.pairwise(rows))
    assert all(r.step_s == 0.1 for r in rows)


# ---- configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dashboard", "message"),
    [
        (
            {"downsample": [{"after_h": 24, "step_s": 600}, {"after_h": 1, "step_s": 60}]},
            "finest to coarsest",
        ),
        (
            {"downsample": [{"after_h": 1, "step_s": 60}, {"after_h": 2, "step_s": 90}]},
            "multiple of the one before",
        ),
        ({"sample_interval_s": 120}, "shorter than sample_interval_s"),
        ({"retention_h": 12}, "not below retention_h"),
        ({"peers": ["host-b:8470"]}, "not an http(s) URL"),
        ({"peers": ["http://"]}, "not an http(s) URL"),
        ({"sample_interval_s": 0}, "dashboard.sample_interval_s"),
    ],
)
def test_bad_dashboard_settings_are_refused(
    tmp_path: Path, dashboard: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(None, state_dir=tmp_path, dashboard=dashboard)
    assert message in info.value.message
    assert "dashboard" in info.value.message


def test_dashboard_settings_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "agentpark.toml"
    path.write_text(
        "[dashboard]\n"
        'host_label = "gpu-7"\n'
        "sample_interval_s = 5\n"
        "retention_h = 72\n"
        "downsample = [{ after_h = 2, step_s = 30 }, { after_h = 48, step_s = 900 }]\n"
        'peers = ["http://gpu-8:8470", "https://gpu-9:8470/"]\n'
    )
    dashboard = load_settings(path).dashboard
    assert dashboard.host_label == "gpu-7"
    assert [(r.after_h, r.step_s) for r in dashboard.downsample] == [(2.0, 30), (48.0, 900)]
    assert dashboard.peers == ["http://gpu-8:8470", "https://gpu-9:8470/"]
