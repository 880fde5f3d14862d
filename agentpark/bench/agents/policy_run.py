"""One policy of ``agentpark bench agents`` on a fresh daemon: every agent in its own
thread, ``/v1/host`` sampled, the daemon's events fetched afterwards."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import httpx

from agentpark.bench.agents.agent import Agent, BlockBudget, Shared
from agentpark.bench.agents.results import PolicyResult
from agentpark.bench.agents.setup import Setup, daemon_settings
from agentpark.bench.agents.timeline import parked_byte_seconds, pool_timeline
from agentpark.bench.agents.workload import KEEP_ALL
from agentpark.bench.daemon import ThreadDaemon

__all__ = ["run_policy"]

EVENTS_LIMIT = 10_000  # the API's most per call


def run_policy(policy: str, setup: Setup, on_turn: Callable[[], None]) -> PolicyResult:
    """One policy on a fresh daemon: every agent in its own thread, /v1/host sampled."""
    result = PolicyResult(policy, [], setup.plans)
    go, stop, sampled = threading.Event(), threading.Event(), threading.Event()
    n = setup.spec.agents
    daemon = ThreadDaemon.start(daemon_settings(policy, setup))
    try:
        with httpx.Client(
            base_url=daemon.url,
            timeout=300.0,
            limits=httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8),
        ) as client:
            budget = BlockBudget(setup.pool_blocks) if policy == KEEP_ALL else None
            shared = Shared(policy, client, setup.block_size, go, stop, budget, on_turn)
            agents = [Agent(shared, plan, setup.spec.seed) for plan in setup.plans]
            threads = [
                threading.Thread(target=agent, name=f"bench-agent-{i}", daemon=True)
                for i, agent in enumerate(agents)
            ]
            threads.append(
                threading.Thread(
                    target=_sample_host,
                    args=(client, setup.sample_s, sampled, stop, result.samples),
                    name="bench-sampler",
                    daemon=True,
                )
            )
            for thread in threads:
                thread.start()
            result.t0 = time.time()
            t0 = time.perf_counter()
            go.set()
            for thread in threads[:-1]:
                thread.join(max(0.0, t0 + setup.timeout_s - time.perf_counter()))
                if thread.is_alive() and not stop.is_set():
                    result.error = f"did not finish within {setup.timeout_s:g}s"
                    stop.set()
            sampled.set()
            for thread in threads:
                thread.join(60)
            result.agents = [agent.result for agent in agents]
            ends = [a.finished_at for a in result.agents if a.finished_at is not None]
            result.makespan_s = (max(ends) if ends else time.perf_counter()) - t0
            sessions = [sid for a in result.agents for sid in a.session_ids]
            result.events = _fetch_events(client, sessions)
    finally:
        stop.set()  # on any way out: no agent keeps calling a daemon that is going away
        go.set()
        daemon.stop()
    result.timeline = pool_timeline(result.events, result.t0)
    result.reclaimed_byte_s = parked_byte_seconds(result.events, result.t0 + result.makespan_s)
    return result


def _sample_host(
    client: httpx.Client,
    every_s: float,
    done: threading.Event,
    stop: threading.Event,
    samples: list[tuple[float, int, int, int]],
) -> None:
    """``(epoch seconds, used blocks, total blocks, reclaimed bytes)`` from /v1/host."""
    while not stop.is_set():
        try:
            host = client.get("/v1/host").json()
        except httpx.HTTPError:  # the run is being torn down
            return
        pool = host["pool"]
        samples.append(
            (time.time(), pool["used_blocks"], pool["total_blocks"], host["reclaimed_bytes"])
        )
        if done.wait(every_s):
            return


def _fetch_events(client: httpx.Client, session_ids: Sequence[str]) -> list[dict[str, Any]]:
    """Every event of the run, oldest first, ``at`` in epoch seconds."""
    raw = _events(client, {"limit": EVENTS_LIMIT})
    if len(raw) >= EVENTS_LIMIT:  # more than one page: per session (each well under it)
        by_id: dict[int, dict[str, Any]] = {}
        for sid in session_ids:
            for event in _events(client, {"limit": EVENTS_LIMIT, "session_id": sid}):
                by_id[int(event["id"])] = event
        raw = list(by_id.values())
    for event in raw:
        event["at"] = datetime.fromisoformat(str(event["at"])).timestamp()
    return sorted(raw, key=lambda e: int(e["id"]))


def _events(client: httpx.Client, params: dict[str, Any]) -> list[dict[str, Any]]:
    response = client.get("/v1/events", params=params)
    response.raise_for_status()
    events: list[dict[str, Any]] = response.json()["events"]
    return events
