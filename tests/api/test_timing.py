"""Server-Timing on every answer, and the parse the bench reads it with."""

from __future__ import annotations

import httpx
import pytest

from agentpark.api.timing import SERVER_TIMING, app_ms
from agentpark.client import AgentparkClient
from tests.harness import InProcessApp, bearer


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/healthz", None, 200),
        ("POST", "/v1/sessions", {}, 201),
        ("GET", "/v1/sessions/nobody-has-this", None, 404),
        ("POST", "/v1/sessions", {"session_id": 7}, 422),
        ("GET", "/v1/events", None, 401),
        ("OPTIONS", "/v1/sessions", None, 204),
        ("PUT", "/v1/host", None, 405),
        ("GET", "/metrics", None, 200),
    ],
)
def test_every_answer_carries_the_daemons_own_time(
    shared_app: InProcessApp,
    app_client: AgentparkClient,
    method: str,
    path: str,
    body: object,
    status: int,
) -> None:
    headers = {} if status == 401 else bearer(app_client.token)  # type: ignore[attr-defined]
    with httpx.Client(base_url="http://in-process", transport=shared_app.transport) as http:
        answer = http.request(method, path, json=body, headers=headers)
        assert answer.status_code == status, answer.text
    (value,) = answer.headers.get_list(SERVER_TIMING)
    ms = app_ms(value)
    assert ms is not None and ms >= 0.0, value


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("app;dur=1.250", 1.25),
        ('db;dur=2, app;desc="agentpark";dur=3', 3.0),
        ("app", None),
        ("app;dur=fast", None),
        ("cache;dur=4", None),
        ("", None),
        (None, None),
    ],
)
def test_app_ms_reads_the_app_metric_only(header: str | None, expected: float | None) -> None:
    assert app_ms(header) == expected
