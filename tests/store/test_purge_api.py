"""A deleted session through the API, before and after its purge (retention.deleted_h),
and /v1/host/latency's figures from SQLite's aggregate, on a real in-process app."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from agentpark.client import AgentparkAPIError
from agentpark.config import Settings
from tests.harness import InProcessApp


def test_a_purged_session_id_can_be_created_again(
    make_settings: Callable[..., Settings], app_factory: Callable[[Settings], InProcessApp]
) -> None:
    running = app_factory(make_settings(retention={"deleted_h": 1.0}))
    client = running.client("purge")
    client.create_session("agent-1", metadata={"task": "trip"})
    client.generate("agent-1", prompt="hello", max_new_tokens=2)
    client.delete_session("agent-1")
    retention = running.runtime.sampler.retention
    assert retention is not None

    # Before the purge, as before retention existed: the row answers, the id is taken.
    assert retention.run(time.time()).purged_rows == 0
    assert [s.session_id for s in client.list_sessions(state="deleted").sessions] == ["agent-1"]
    with pytest.raises(AgentparkAPIError) as taken:
        client.create_session("agent-1")
    assert (taken.value.status, taken.value.code) == (409, "session_exists")

    # An hour later the sampler's upkeep purges it: token log, logits, metadata, the row.
    running.runtime.sampler.tick(time.time() + 3601.0)
    assert retention.run(time.time() + 3601.0).total == 0  # nothing left to do
    with pytest.raises(AgentparkAPIError) as gone:
        client.get_session("agent-1")
    assert gone.value.status == 404
    assert running.runtime.store.get("purge", "agent-1") is None
    fresh = client.create_session("agent-1")
    assert (fresh.state, fresh.num_tokens, fresh.metadata) == ("active", 0, {})
    assert [e.kind for e in client.events("agent-1").events] == ["create"]


def test_latency_counts_pauses_and_resumes_from_the_aggregate(app_client: object) -> None:
    from agentpark.client import AgentparkClient

    assert isinstance(app_client, AgentparkClient)
    before = app_client.latency(window_s=3600)
    app_client.create_session("lat")
    app_client.generate("lat", prompt="hi", max_new_tokens=2)
    app_client.pause("lat", force=True)
    app_client.resume("lat")
    after = app_client.latency(window_s=3600)
    assert after.pause.count == before.pause.count + 1
    assert after.resume.count == before.resume.count + 1
    assert after.pause.p50_ms is not None and after.pause.bytes > before.pause.bytes
