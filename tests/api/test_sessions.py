"""/v1/sessions: a deleted session is gone as a resource (404), its history stays readable."""

from __future__ import annotations

import pytest

from agentpark.client import AgentparkAPIError, AgentparkClient


def test_a_deleted_session_answers_404_and_its_history_stays_in_the_events(
    app_client: AgentparkClient,
) -> None:
    c = app_client
    c.create_session("gone")
    c.generate("gone", "hello", max_new_tokens=4)
    assert c.request("DELETE", "/v1/sessions/gone").status_code == 204

    # The client raises as for any unknown session; the message says where the history is.
    with pytest.raises(AgentparkAPIError) as raised:
        c.get_session("gone")
    error = raised.value
    assert (error.status, error.code) == (404, "session_not_found")
    assert "deleted" in error.message and "/v1/events?session_id=gone" in error.message
    assert error.details["session_id"] == "gone" and error.details["deleted_at"] > 0

    kinds = [e.kind for e in c.events("gone").events]
    assert kinds[0] == "delete" and "create" in kinds and "generate" in kinds
    assert [s.session_id for s in c.list_sessions(state="deleted").sessions] == ["gone"]
    # Deleting again stays a no-op (DELETE is idempotent).
    assert c.request("DELETE", "/v1/sessions/gone").status_code == 204


def test_an_unknown_session_still_answers_the_plain_404(app_client: AgentparkClient) -> None:
    with pytest.raises(AgentparkAPIError) as raised:
        app_client.get_session("never")
    assert (raised.value.status, raised.value.message) == (404, "session 'never' not found")
