"""The body limit against a real uvicorn daemon: every common client reads the 413.

A server that answers before reading the body and closes with the body unread in its
socket makes the kernel send a reset; a client still writing (urllib writes the whole
body before it reads) then sees "connection reset by peer" instead of the answer. The
refused body is drained (bounded), then the 413 goes out with ``Connection: close``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import httpx
import pytest
import requests

from agentpark.config import Settings
from tests.harness import Daemon

LIMIT = 1024
# Far more than the socket buffers hold, so the client is still writing when the server
# has answered.
BIG = b'{"session_id": "' + b"x" * (8 * 2**20) + b'"}'


@pytest.fixture
def small(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> Daemon:
    return daemon_factory(make_settings(limits={"max_body_bytes": LIMIT}))


def _refused(status: int, body: bytes, connection: str | None) -> None:
    assert status == 413
    assert json.loads(body)["error"]["code"] == "payload_too_large"
    assert connection == "close"


def test_urllib_which_writes_the_whole_body_first_reads_the_413(small: Daemon) -> None:
    request = urllib.request.Request(
        f"{small.url}/v1/sessions",
        data=BIG,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    answer = refused.value
    _refused(answer.code, answer.read(), answer.headers.get("Connection"))
    answer.close()


def test_httpx_reads_the_413_and_its_next_request_works(small: Daemon) -> None:
    answer = small.client.post("/v1/sessions", content=BIG)
    _refused(answer.status_code, answer.content, answer.headers.get("Connection"))
    assert small.client.post("/v1/sessions", json={"session_id": "after"}).status_code == 201


def test_requests_reads_the_413(small: Daemon) -> None:
    with requests.Session() as session:
        answer = session.post(f"{small.url}/v1/sessions", data=BIG, timeout=60)
        _refused(answer.status_code, answer.content, answer.headers.get("Connection"))
        again = session.post(f"{small.url}/v1/sessions", json={"session_id": "r"}, timeout=60)
        assert again.status_code == 201


def _chunks() -> Iterator[bytes]:
    for _ in range(64):
        yield b"y" * 2**16


def test_a_chunked_body_over_the_limit_is_read_to_its_end_and_refused(small: Daemon) -> None:
    answer = requests.post(f"{small.url}/v1/sessions", data=_chunks(), timeout=60)
    _refused(answer.status_code, answer.content, answer.headers.get("Connection"))
    with httpx.Client(base_url=small.url, timeout=60) as client:
        answer2 = client.post("/v1/sessions", content=_chunks())
    _refused(answer2.status_code, answer2.content, answer2.headers.get("Connection"))


def test_a_body_within_the_limit_keeps_the_connection(small: Daemon) -> None:
    answer = small.client.post("/v1/sessions", json={"session_id": "fits"})
    assert answer.status_code == 201
    assert answer.headers.get("Connection") != "close"
