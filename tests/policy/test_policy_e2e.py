"""The policy loop and decisions on a real daemon: idle, pressure, prefetch, learning, reload."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from agentpark.config import Settings
from tests.harness import (
    Daemon,
    DaemonProcess,
    free_port,
    settled,
    start_daemon,
    wait_until,
    write_config,
)

PROMPT = {"prompt": "Plan the next step, then call a tool.", "max_new_tokens": 20}


def _events(c: httpx.Client, sid: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = c.get("/v1/events", params={"session_id": sid}).json()["events"]
    return events


def _start(c: httpx.Client, *sids: str, prompt: dict[str, Any] = PROMPT) -> None:
    for sid in sids:
        c.post("/v1/sessions", json={"session_id": sid})
        c.post(f"/v1/sessions/{sid}/generate", json=prompt)


def test_an_untouched_session_is_parked_by_the_idle_rule(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    daemon = daemon_factory(make_settings(policy={"idle_pause_after_s": 0.3}))
    c = daemon.client
    _start(c, "idle")
    wait_until(lambda: any(e["kind"] == "pause" for e in _events(c, "idle")), timeout=30)
    pause = next(e for e in _events(c, "idle") if e["kind"] == "pause")
    assert pause["reason"] == "idle" and pause["to_tier"] == "dram"
    assert c.get("/v1/sessions/idle").json()["state"] == "parked"


def test_a_generate_that_needs_room_parks_idle_sessions_lru_first(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    # 16 blocks; three idle sessions of 4 blocks each; the loop's watermark never fires.
    daemon = daemon_factory(
        make_settings(pool={"num_blocks": 16}, policy={"hbm_high_watermark": 1.0})
    )
    c = daemon.client
    _start(c, "oldest", "middle", "newest", prompt={"prompt_tokens": [5] * 50, "max_new_tokens": 4})
    assert c.get("/v1/host").json()["pool"]["free_blocks"] == 4
    c.post("/v1/sessions", json={"session_id": "new"})
    out = c.post(
        "/v1/sessions/new/generate", json={"prompt_tokens": [9] * 100, "max_new_tokens": 8}
    )
    assert out.status_code == 200, out.text  # 7 blocks needed, 4 free: room was made
    states = {s["session_id"]: s["state"] for s in c.get("/v1/sessions").json()["sessions"]}
    assert states == {"oldest": "parked", "middle": "active", "newest": "active", "new": "active"}
    assert _events(c, "oldest")[0]["reason"] == "pressure"


def test_the_watermark_parks_least_recently_used_sessions(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    daemon = daemon_factory(
        make_settings(pool={"num_blocks": 16}, policy={"hbm_high_watermark": 0.6})
    )
    c = daemon.client
    # 3 x 4 blocks = 75% > 60%: the loop parks the least recently used one, then stops.
    _start(c, "a", "b", "c", prompt={"prompt_tokens": [5] * 50, "max_new_tokens": 4})
    wait_until(lambda: settled(daemon, "a", "parked"))
    assert _events(c, "a")[0]["reason"] == "pressure"
    assert [c.get(f"/v1/sessions/{s}").json()["state"] for s in ("b", "c")] == ["active"] * 2


def test_a_session_with_an_expected_resume_is_prefetched_before_it(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    daemon = daemon_factory(make_settings(policy={"min_pause_s": 0, "prefetch_lead_s": 1.0}))
    c = daemon.client
    _start(c, "s")
    paused = c.post("/v1/sessions/s/pause", json={"tool": "search", "expected_resume_s": 1.5})
    assert paused.json()["decision"] == "parked" and paused.json()["state"] == "parked"
    expected_at = time.time() + 1.5
    wait_until(lambda: settled(daemon, "s", "active"), timeout=30)
    prefetch = next(e for e in _events(c, "s") if e["kind"] == "resume")
    assert prefetch["reason"] == "prefetch"
    back_at = c.get("/v1/sessions/s").json()["last_active_at"]
    assert _epoch(back_at) < expected_at  # back in the pool before the agent needs it
    resumed = c.post("/v1/sessions/s/resume").json()
    assert resumed["restored_from"] == "pool" and resumed["resume_ms"] == 0.0


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_a_pause_shorter_than_the_break_even_keeps_the_session_in_the_pool(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    daemon = daemon_factory(make_settings(policy={"min_pause_s": 2.0}))
    c = daemon.client
    _start(c, "s")
    kept = c.post("/v1/sessions/s/pause", json={"expected_resume_s": 0.5}).json()
    assert kept["decision"] == "kept" and kept["state"] == "active"
    assert "break-even 2s" in kept["why"] and kept["expected_pause_s"] == 0.5
    assert _events(c, "s")[0]["kind"] == "keep"
    forced = c.post("/v1/sessions/s/pause", json={"expected_resume_s": 0.5, "force": True})
    assert forced.json()["decision"] == "parked" and forced.json()["state"] == "parked"


def test_tool_pauses_are_learned_and_priors_stand_in_until_then(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    tools = {"web_search": {"expected_pause_s": 8}}
    daemon = daemon_factory(make_settings(policy={"min_pause_s": 1.0, "tools": tools}))
    c = daemon.client
    _start(c, "s")
    first = c.post("/v1/sessions/s/pause", json={"tool": "web_search"}).json()
    assert first["decision"] == "parked" and "configured prior" in first["why"]
    c.post("/v1/sessions/s/resume")  # the tool came back at once
    unknown = c.post("/v1/sessions/s/pause", json={"tool": "calculator"}).json()
    assert unknown["decision"] == "parked" and "never seen" in unknown["why"]
    c.post("/v1/sessions/s/generate", json={"max_new_tokens": 2})  # calculator returned fast
    learned = c.post("/v1/sessions/s/pause", json={"tool": "calculator"}).json()
    assert learned["decision"] == "kept" and "learned" in learned["why"]
    assert learned["expected_pause_s"] < 1.0
    policy = c.get("/v1/admin/policy").json()
    assert policy["tools"]["calculator"]["observed"] == 1
    assert policy["tools"]["web_search"]["observed"] == 1


def test_parked_sessions_are_demoted_by_age(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    daemon = daemon_factory(make_settings(policy={"demote_after_s": {"dram": 0.2}}))
    c = daemon.client
    _start(c, "s")
    assert c.post("/v1/sessions/s/pause").json()["tier"] == "dram"
    wait_until(lambda: c.get("/v1/sessions/s").json()["tier"] == "shm", timeout=30)
    # The live tier may show before the move's event row is committed: wait for the row.
    wait_until(lambda: _events(c, "s")[0]["kind"] == "move", timeout=30)
    move = _events(c, "s")[0]
    assert move["kind"] == "move" and move["reason"] == "demote"
    assert (move["from_tier"], move["to_tier"]) == ("dram", "shm")
    assert c.post("/v1/sessions/s/resume").json()["restored_from"] == "shm"


def test_reload_applies_a_valid_policy_and_refuses_a_bad_file(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings()
    config = write_config(tmp_path / "agentpark.toml", settings)
    daemon = start_daemon(settings, config)
    try:
        c = daemon.client
        daemon.admin()  # reload is an admin route, even on loopback
        text = config.read_text()
        assert "idle_pause_after_s = 0.0\n" in text
        config.write_text(text.replace("idle_pause_after_s = 0.0", "idle_pause_after_s = 42.0"))
        ok = c.post("/v1/admin/reload")
        assert ok.status_code == 200 and ok.json()["policy"]["idle_pause_after_s"] == 42.0
        assert c.get("/v1/admin/policy").json()["policy"]["idle_pause_after_s"] == 42.0
        config.write_text(config.read_text().replace("= 42.0", "= -5"))
        bad = c.post("/v1/admin/reload")
        assert bad.status_code == 422
        message = bad.json()["error"]["message"]
        assert "policy.idle_pause_after_s" in message and "old policy stays" in message
        assert c.get("/v1/admin/policy").json()["policy"]["idle_pause_after_s"] == 42.0
    finally:
        daemon.stop()


def test_sighup_reloads_the_policy_of_a_running_daemon(
    make_settings: Callable[..., Settings],
    daemon_process: Callable[[Path, int], DaemonProcess],
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path / "agentpark.toml", make_settings())
    daemon = daemon_process(config, free_port())
    config.write_text(config.read_text().replace("tick_s = 0.05", "tick_s = 0.25"))
    daemon.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: daemon.client.get("/v1/admin/policy").json()["policy"]["tick_s"] == 0.25)
    assert daemon.proc.poll() is None  # reloaded, still serving


def test_a_parked_copy_past_its_ttl_is_dropped_and_recomputed_on_resume(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    # The loop runs on the real clock (never reaching the ttl); the test ticks it ahead.
    daemon = daemon_factory(make_settings(policy={"parked_ttl_s": 3600}))
    c = daemon.client
    _start(c, "old")
    assert c.post("/v1/sessions/old/pause", json={"force": True}).json()["state"] == "parked"
    policy = daemon.runtime.policy
    assert policy.engine_rules is True  # the reference engine: every rule runs
    assert policy.tick(time.time() + 3601) != []
    session = c.get("/v1/sessions/old").json()
    assert session["state"] == "lost" and "parked_ttl_s" in session["lost_reason"]
    lost = _events(c, "old")[0]
    assert (lost["kind"], lost["reason"]) == ("lost", "ttl")
    assert c.get("/v1/host").json()["tiers"]["dram"]["used_blocks"] == 0
    metrics = c.get("/metrics").text
    assert "agentpark_sessions_lost_total{host=" in metrics and 'reason="ttl"} 1.0' in metrics
    resumed = c.post("/v1/sessions/old/resume", json={}).json()
    assert resumed["restored_from"] == "recompute" and resumed["state"] == "active"
