"""/metrics on a real server: exact counts and bytes after scripted sessions, parsed with
prometheus_client's own parser."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentpark.config import Settings
from agentpark.metrics import METRIC_NAMES
from agentpark.store.models import EventRow
from agentpark.tiers.filetier import HEADER_BYTES
from tests.harness import Daemon

HOST = "test-host-1"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(daemon: Daemon) -> Samples:
    response = daemon.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset({"host": HOST, **labels}.items()))
    assert key in samples, f"{name}{labels} is not exported"
    return samples[key]


@pytest.fixture
def host_daemon(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> Daemon:
    return daemon_factory(make_settings(dashboard={"host_label": HOST}, policy={"enabled": False}))


def _event(daemon: Daemon, session_id: str, kind: str) -> dict[str, Any]:
    events = daemon.client.get("/v1/events", params={"session_id": session_id}).json()
    (event,) = [e for e in events["events"] if e["kind"] == kind]
    return dict(event)


def test_create_generate_pause_resume_shows_exact_counts_and_bytes(host_daemon: Daemon) -> None:
    c = host_daemon.client
    before = scrape(host_daemon)
    assert value(before, "agentpark_pauses_total", reason="explicit", tier="dram") == 0
    assert value(before, "agentpark_sessions", state="active") == 0
    assert value(before, "agentpark_ready") == 1

    assert c.post("/v1/sessions", json={"session_id": "a"}).status_code == 201
    prompt = {"prompt": "Find flights to Lisbon and compare prices.", "max_new_tokens": 24}
    assert c.post("/v1/sessions/a/generate", json=prompt).status_code == 200
    session = c.get("/v1/sessions/a").json()
    kv_bytes, kv_blocks = session["kv_bytes"], session["kv_blocks"]
    assert kv_blocks >= 2

    paused = c.post("/v1/sessions/a/pause", json={"tool": "web_search", "tier": "dram"})
    assert paused.status_code == 200 and paused.json()["tier"] == "dram"
    host = c.get("/v1/host").json()
    parked = scrape(host_daemon)
    # Gauges equal the host view while parked.
    assert value(parked, "agentpark_hbm_reclaimed_bytes") == host["reclaimed_bytes"] == kv_bytes
    assert value(parked, "agentpark_parked_bytes", tier="dram") == kv_bytes
    assert value(parked, "agentpark_parked_bytes", tier="shm") == 0
    assert value(parked, "agentpark_tier_used_bytes", tier="dram") == kv_bytes
    assert value(parked, "agentpark_tier_used_blocks", tier="dram") == kv_blocks
    dram = host["tiers"]["dram"]
    assert value(parked, "agentpark_tier_capacity_bytes", tier="dram") == dram["capacity_bytes"]
    assert value(parked, "agentpark_tier_capacity_blocks", tier="dram") == dram["capacity_blocks"]
    for state in ("free", "used"):
        assert (
            value(parked, "agentpark_pool_blocks", state=state) == host["pool"][f"{state}_blocks"]
        )
        assert value(parked, "agentpark_pool_bytes", state=state) == host["pool"][f"{state}_bytes"]
    assert value(parked, "agentpark_pool_block_bytes") == host["pool"]["block_bytes"]
    assert value(parked, "agentpark_sessions", state="parked") == 1
    assert value(parked, "agentpark_sessions", state="active") == 0

    assert c.post("/v1/sessions/a/resume").json()["restored_from"] == "dram"
    pause, resume = _event(host_daemon, "a", "pause"), _event(host_daemon, "a", "resume")
    after = scrape(host_daemon)

    for kind in ("create", "generate", "pause", "resume"):
        assert value(after, "agentpark_events_total", kind=kind) == 1
    assert value(after, "agentpark_pauses_total", reason="explicit", tier="dram") == 1
    for reason in ("idle", "pressure", "drain"):
        assert value(after, "agentpark_pauses_total", reason=reason, tier="dram") == 0
    assert value(after, "agentpark_resumes_total", source="dram", reason="explicit") == 1
    assert value(after, "agentpark_resumes_total", source="recompute", reason="explicit") == 0
    assert value(after, "agentpark_recompute_fallbacks_total", reason="explicit") == 0
    assert value(after, "agentpark_restore_failures_total", tier="dram") == 0
    # Bytes moved, each way, exactly the session's KV.
    assert value(after, "agentpark_transfer_bytes_total", direction="park", tier="dram") == kv_bytes
    assert (
        value(after, "agentpark_transfer_bytes_total", direction="restore", tier="dram")
        == kv_bytes
        == resume["bytes"]
    )
    assert value(after, "agentpark_transfer_bytes_total", direction="park", tier="shm") == 0
    # Latency and bandwidth come from the same events /v1/events shows.
    pause_s, resume_s = pause["duration_ms"] / 1e3, resume["duration_ms"] / 1e3
    assert value(after, "agentpark_pause_duration_seconds_count", tier="dram") == 1
    assert value(after, "agentpark_pause_duration_seconds_sum", tier="dram") == pytest.approx(
        pause_s, rel=1e-9
    )
    assert value(after, "agentpark_resume_duration_seconds_count", source="dram") == 1
    assert value(after, "agentpark_resume_duration_seconds_sum", source="dram") == pytest.approx(
        resume_s, rel=1e-9
    )
    assert value(after, "agentpark_pause_duration_seconds_bucket", tier="dram", le="+Inf") == 1
    assert value(after, "agentpark_pause_duration_seconds_bucket", tier="dram", le="0.0001") == (
        1 if pause_s <= 0.0001 else 0
    )
    park_seconds = value(after, "agentpark_transfer_seconds_total", direction="park", tier="dram")
    assert park_seconds == pytest.approx(pause_s, rel=1e-9)
    bandwidth = "agentpark_transfer_bandwidth_bytes_per_second"
    assert value(after, f"{bandwidth}_count", direction="park", tier="dram") == 1
    assert value(after, f"{bandwidth}_sum", direction="park", tier="dram") == pytest.approx(
        kv_bytes / pause_s, rel=1e-9
    )
    # Back in the pool: nothing reclaimed, the blocks used again.
    assert value(after, "agentpark_hbm_reclaimed_bytes") == 0
    assert value(after, "agentpark_parked_bytes", tier="dram") == 0
    assert value(after, "agentpark_pool_blocks", state="used") == kv_blocks
    assert value(after, "agentpark_sessions", state="active") == 1

    # A generate on a parked session resumes it first: counted with reason "generate".
    c.post("/v1/sessions/a/pause", json={"tier": "dram"})
    assert c.post("/v1/sessions/a/generate", json={"max_new_tokens": 4}).json()["resumed"]
    last = scrape(host_daemon)
    assert value(last, "agentpark_pauses_total", reason="explicit", tier="dram") == 2
    assert value(last, "agentpark_resumes_total", source="dram", reason="generate") == 1
    assert value(last, "agentpark_resumes_total", source="dram", reason="explicit") == 1
    # The second pause copied only what the tier lacked: the blocks restored from it are
    # still there by content; the partial last block (no key) is copied again.
    events = c.get("/v1/events", params={"session_id": "a"}).json()["events"]
    second = max((e for e in events if e["kind"] == "pause"), key=lambda e: e["id"])
    block = kv_bytes // kv_blocks
    assert second["bytes"] == block and "shared=" in second["detail"]
    assert value(last, "agentpark_transfer_bytes_total", direction="park", tier="dram") == (
        kv_bytes + second["bytes"]
    )
    assert value(last, "agentpark_events_total", kind="generate") == 2


def test_every_metric_is_exported_from_the_start_with_the_host_label(host_daemon: Daemon) -> None:
    samples = scrape(host_daemon)
    text = host_daemon.client.get("/metrics").text
    families = {f.name for f in text_string_to_metric_families(text)}
    # The parser names a counter's family without _total; _created are the counters' starts.
    listed = {n.removesuffix("_total") for n in METRIC_NAMES}
    ours = {f for f in families if f.startswith("agentpark_") and not f.endswith("_created")}
    assert ours == listed
    agentpark = [dict(labels) for name, labels in samples if name.startswith("agentpark_")]
    assert agentpark and all(labels.get("host") == HOST for labels in agentpark)
    info = [dict(labels) for name, labels in samples if name == "agentpark_build_info"]
    assert info and info[0]["version"] and info[0]["dma_backend"] == "host_copy"
    assert any(name == "process_start_time_seconds" for name, _ in samples)
    # Each app has its own registry: nothing lands in the process-wide default one.
    assert host_daemon.runtime.metrics.registry is not prometheus_client.REGISTRY
    assert prometheus_client.REGISTRY.get_sample_value("agentpark_ready") is None


def test_openmetrics_is_served_to_a_scraper_that_asks(host_daemon: Daemon) -> None:
    response = host_daemon.client.get(
        "/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")


def test_restore_failure_and_recompute_fallback_are_counted(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No drain at stop: a session parked in dram is gone after the restart.
    settings = make_settings(
        dashboard={"host_label": HOST}, shutdown={"drain": False}, policy={"enabled": False}
    )
    first = daemon_factory(settings)
    c = first.client
    c.post("/v1/sessions", json={"session_id": "f"})
    c.post("/v1/sessions/f/generate", json={"prompt": "hello there", "max_new_tokens": 8})
    assert c.post("/v1/sessions/f/pause", json={"tier": "dram"}).json()["state"] == "parked"

    def broken_h2d(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("injected: DMA engine fell over")

    monkeypatch.setattr(first.runtime.driver.transfer, "h2d", broken_h2d)
    assert c.post("/v1/sessions/f/resume").status_code == 500
    assert c.get("/v1/sessions/f").json()["state"] == "parked"  # the copy is kept
    samples = scrape(first)
    assert value(samples, "agentpark_restore_failures_total", tier="dram") == 1
    assert value(samples, "agentpark_events_total", kind="restore_failed") == 1
    assert value(samples, "agentpark_resumes_total", source="dram", reason="explicit") == 0
    first.stop()

    # After the restart the parked copy is gone: the resume rebuilds it by re-prefill.
    second = daemon_factory(settings)
    restarted = scrape(second)
    assert value(restarted, "agentpark_sessions", state="lost") == 1
    assert value(restarted, "agentpark_sessions_lost_total", reason="restart") == 1
    assert value(restarted, "agentpark_restore_failures_total", tier="dram") == 0  # new process
    assert second.client.post("/v1/sessions/f/resume").json()["restored_from"] == "recompute"
    samples = scrape(second)
    assert value(samples, "agentpark_recompute_fallbacks_total", reason="explicit") == 1
    assert value(samples, "agentpark_resumes_total", source="recompute", reason="explicit") == 1
    assert value(samples, "agentpark_resume_duration_seconds_count", source="recompute") == 1
    assert value(samples, "agentpark_sessions", state="lost") == 0
    # Recompute copies nothing back from a tier.
    assert value(samples, "agentpark_transfer_bytes_total", direction="restore", tier="dram") == 0


def test_a_corrupt_parked_copy_counts_a_restore_failure_and_a_checksum_recompute(
    host_daemon: Daemon,
) -> None:
    c = host_daemon.client
    c.post("/v1/sessions", json={"session_id": "x"})
    c.post("/v1/sessions/x/generate", json={"prompt": "flip a bit", "max_new_tokens": 20})
    assert c.post("/v1/sessions/x/pause", json={"tier": "shm"}).json()["tier"] == "shm"
    parking = host_daemon.runtime.parking
    slot = parking.live("default", "x").slots[0]
    path = parking.tiers["shm"].path  # type: ignore[attr-defined]
    offset = HEADER_BYTES + slot * host_daemon.runtime.engine.geometry.block_nbytes + 7
    with path.open("r+b") as f:  # damage the parked copy, as another process could
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))
    before = scrape(host_daemon)
    assert value(before, "agentpark_restore_failures_total", tier="shm") == 0
    assert value(before, "agentpark_recompute_fallbacks_total", reason="checksum") == 0
    assert value(before, "agentpark_sessions_lost_total", reason="checksum") == 0

    assert c.post("/v1/sessions/x/resume").json()["restored_from"] == "recompute"
    after = scrape(host_daemon)
    # The alerting counters move, each by exactly one, with the tier and the reason.
    assert value(after, "agentpark_restore_failures_total", tier="shm") == 1
    assert value(after, "agentpark_restore_failures_total", tier="dram") == 0
    assert value(after, "agentpark_recompute_fallbacks_total", reason="checksum") == 1
    assert value(after, "agentpark_recompute_fallbacks_total", reason="explicit") == 0
    assert value(after, "agentpark_sessions_lost_total", reason="checksum") == 1
    assert value(after, "agentpark_sessions_lost_total", reason="restart") == 0
    # The events are counted as before: one corrupt, one recompute, an explicit resume.
    assert value(after, "agentpark_events_total", kind="corrupt") == 1
    assert value(after, "agentpark_events_total", kind="recompute") == 1
    assert value(after, "agentpark_resumes_total", source="recompute", reason="explicit") == 1
    assert value(after, "agentpark_resumes_total", source="shm", reason="explicit") == 0
    assert value(after, "agentpark_transfer_bytes_total", direction="restore", tier="shm") == 0

    # The next park and resume of the same session is an ordinary one again.
    c.post("/v1/sessions/x/pause", json={"tier": "shm"})
    assert c.post("/v1/sessions/x/resume").json()["restored_from"] == "shm"
    last = scrape(host_daemon)
    assert value(last, "agentpark_restore_failures_total", tier="shm") == 1
    assert value(last, "agentpark_recompute_fallbacks_total", reason="checksum") == 1
    assert value(last, "agentpark_resumes_total", source="shm", reason="explicit") == 1


def test_moves_between_tiers_are_counted_by_kind_and_tier(host_daemon: Daemon) -> None:
    c = host_daemon.client
    c.post("/v1/sessions", json={"session_id": "m"})
    c.post("/v1/sessions/m/generate", json={"prompt": "move me", "max_new_tokens": 20})
    kv_bytes = c.post("/v1/sessions/m/pause", json={"tier": "dram"}).json()["kv_bytes"]
    moved = c.post("/v1/sessions/m/move", json={"tier": "shm"})
    assert moved.status_code == 200 and moved.json()["tier"] == "shm"
    samples = scrape(host_daemon)
    moves = value(
        samples, "agentpark_tier_moves_total", kind="move", from_tier="dram", to_tier="shm"
    )
    assert moves == 1
    assert (
        value(samples, "agentpark_transfer_bytes_total", direction="move", tier="shm") == kv_bytes
    )
    assert value(samples, "agentpark_parked_bytes", tier="shm") == kv_bytes
    assert value(samples, "agentpark_parked_bytes", tier="dram") == 0
    resumed = c.post("/v1/sessions/m/resume").json()
    assert resumed["restored_from"] == "shm"
    samples = scrape(host_daemon)
    assert value(samples, "agentpark_resumes_total", source="shm", reason="explicit") == 1
    assert value(samples, "agentpark_transfer_bytes_total", direction="restore", tier="shm") == (
        kv_bytes
    )


def test_a_broken_event_never_breaks_parking(host_daemon: Daemon) -> None:
    metrics = host_daemon.runtime.metrics
    odd = EventRow(kind="pause", reason=None, to_tier=None, bytes=None, duration_ms=None)
    metrics.observe(odd)  # counted with placeholders, no copy recorded
    metrics.observe(EventRow(kind="something_new"))
    metrics.observe(EventRow(kind="resume", duration_ms="not a number"))  # type: ignore[arg-type]
    samples = scrape(host_daemon)
    assert value(samples, "agentpark_pauses_total", reason="explicit", tier="unknown") == 1
    assert value(samples, "agentpark_events_total", kind="something_new") == 1
    assert value(samples, "agentpark_transfer_bytes_total", direction="park", tier="dram") == 0
