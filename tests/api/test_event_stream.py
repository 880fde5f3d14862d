"""GET /v1/events/stream on a real uvicorn daemon: delivery of committed events, resume,
the slow subscriber dropped, the subscriber limits, tenants apart, keep-alive, shutdown."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from agentpark.config import Settings
from agentpark.eventstream import EventHub
from tests.api.standin import BLOCK, StandInEngine, vllm_mode
from tests.harness import Daemon, bearer, wait_until

Frame = dict[str, Any]


def _hub(daemon: Daemon) -> EventHub:
    hub: EventHub = daemon.app.state.streams
    return hub


class Stream:
    """An open event stream, read frame by frame (comments kept as ``comment``)."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._lines = response.iter_lines()

    def next(self) -> Frame:
        frame: Frame = {}
        for line in self._lines:
            if line == "":
                if frame:
                    return frame
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "":
                frame["comment"] = value
            else:
                frame[name] = json.loads(value) if name == "data" else value
        raise EOFError("the stream ended")

    def events(self, n: int) -> list[Frame]:
        """The next ``n`` event frames (comments skipped)."""
        got: list[Frame] = []
        while len(got) < n:
            frame = self.next()
            if "comment" not in frame:
                got.append(frame)
        return got


@contextmanager
def stream(daemon: Daemon, token: str | None = None, **params_and_headers: Any) -> Iterator[Stream]:
    headers = dict(params_and_headers.pop("headers", {}))
    if token is not None:
        headers.update(bearer(token))
    with (
        httpx.Client(base_url=daemon.url, timeout=30) as client,
        client.stream(
            "GET", "/v1/events/stream", params=params_and_headers, headers=headers
        ) as response,
    ):
        assert response.status_code == 200, response.read()
        yield Stream(response)


def test_a_committed_event_reaches_the_stream_with_its_id_and_request(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    shm_dir: Path,
) -> None:
    daemon = daemon_factory(make_settings(vllm=vllm_mode(shm_dir)))
    assert daemon.runtime.vllm is not None
    engine = StandInEngine(str(daemon.runtime.vllm.socket_path))
    try:
        with stream(daemon) as watch:  # subscribed once the answer's head is in
            tokens = list(range(1, 2 * BLOCK + 1))
            assert engine.end_turn("agent", tokens, "chatcmpl-w-1234abcd")["decision"] == "parked"
            frames = watch.events(3)  # create, turn, pause
        stored = daemon.client.get("/v1/events", params={"limit": 10}).json()["events"][::-1]
        assert [int(f["id"]) for f in frames] == [e["id"] for e in stored]
        assert [f["data"] for f in frames] == stored
        assert [f["data"]["kind"] for f in frames] == ["create", "turn", "pause"]
        assert frames[-1]["data"]["request_id"] == "chatcmpl-w-1234abcd"
    finally:
        engine.close()


def test_a_stream_resumes_after_last_event_id_from_the_database(daemon: Daemon) -> None:
    for name in ("s1", "s2", "s3"):
        daemon.client.post("/v1/sessions", json={"session_id": name})
    stored = daemon.client.get("/v1/events").json()["events"][::-1]
    first = stored[0]["id"]
    with stream(daemon, headers={"Last-Event-ID": str(first)}) as watch:
        replayed = watch.events(2)
        assert [f["data"]["session_id"] for f in replayed] == ["s2", "s3"]
        daemon.client.post("/v1/sessions", json={"session_id": "s4"})
        (live,) = watch.events(1)
        assert live["data"]["session_id"] == "s4" and int(live["id"]) > int(replayed[-1]["id"])
    # ?after= does the same; the header wins over it (EventSource resends the URL as it was).
    with stream(daemon, after=stored[1]["id"]) as watch:
        assert [f["data"]["session_id"] for f in watch.events(2)] == ["s3", "s4"]
    with stream(daemon, after=0, headers={"Last-Event-ID": str(stored[2]["id"])}) as watch:
        assert watch.events(1)[0]["data"]["session_id"] == "s4"


def test_a_subscriber_that_does_not_read_is_dropped_with_an_overflow_event(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    daemon = daemon_factory(make_settings(limits={"stream_queue_events": 4}))
    hub = _hub(daemon)
    port = int(daemon.url.rsplit(":", 1)[1])

    class Narrow(http.client.HTTPConnection):
        """A client whose socket holds little: the server's writes back up at once."""

        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
            self.sock.connect((self.host, self.port))

    slow = Narrow("127.0.0.1", port, timeout=60)
    slow.request("GET", "/v1/events/stream")
    wait_until(lambda: hub.subscribers("default") == 1)
    core = daemon.runtime.parking
    made = 0
    while hub.overflows == 0:  # real commits, as fast as the core makes them
        assert made < 50_000, "the stream never fell behind"
        core.create("default", None, None)
        made += 1
    assert hub.subscribers("default") == 0  # dropped at once: nothing more is queued for it
    answer = slow.getresponse()
    assert answer.status == 200
    text = answer.read().decode()  # the stream ended: the body is complete
    slow.close()
    tail = text.rstrip("\n").split("\n\n")[-1]
    assert tail.startswith("event: overflow\n"), tail
    data = json.loads(tail.split("data: ", 1)[1])
    last = data["last_event_id"]
    ids = [int(line[4:]) for line in text.splitlines() if line.startswith("id: ")]
    assert ids == sorted(ids) and len(ids) < made and (not ids or ids[-1] == last)
    # Resuming from last_event_id from the database gives the rest.
    with stream(daemon, after=last or 0) as watch:
        assert int(watch.events(1)[0]["id"]) > (last or 0)


def test_streams_past_the_tenants_or_the_daemons_limit_are_429(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    daemon = daemon_factory(make_settings(limits={"max_streams": 2, "max_streams_per_tenant": 1}))
    a, b, c = (daemon.token(t) for t in ("a", "b", "c"))
    with stream(daemon, a):
        again = httpx.get(f"{daemon.url}/v1/events/stream", headers=bearer(a))
        assert again.status_code == 429
        error = again.json()["error"]
        assert error["code"] == "too_many_streams" and error["details"]["limit"] == 1
        assert "Retry-After" in again.headers
        with stream(daemon, b):
            third = httpx.get(f"{daemon.url}/v1/events/stream", headers=bearer(c))
            assert third.status_code == 429
            assert third.json()["error"]["details"]["limit"] == 2
    wait_until(lambda: _hub(daemon).subscribers() == 0)  # closed streams free their place
    with stream(daemon, c):
        pass


def test_a_tenant_sees_only_its_own_events(daemon: Daemon) -> None:
    a, b = daemon.token("a"), daemon.token("b")
    with stream(daemon, a) as watch_a, stream(daemon, b) as watch_b:
        for token, name in ((a, "a-secret"), (b, "b-own")):
            made = httpx.post(
                f"{daemon.url}/v1/sessions", json={"session_id": name}, headers=bearer(token)
            )
            assert made.status_code == 201
        assert watch_b.events(1)[0]["data"]["session_id"] == "b-own"  # a's came first
        assert watch_a.events(1)[0]["data"]["session_id"] == "a-secret"


def test_an_idle_stream_sends_keep_alive_comments(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    daemon = daemon_factory(make_settings(limits={"stream_keepalive_s": 0.05}))
    with stream(daemon) as watch:
        comments = [watch.next().get("comment") for _ in range(3)]
    assert comments[0] == "connected" and comments[1:] == ["keep-alive", "keep-alive"]


def test_the_stream_ends_cleanly_when_the_daemon_stops(daemon: Daemon) -> None:
    with stream(daemon) as watch:
        assert watch.next() == {"comment": "connected"}
        stopper = threading.Thread(target=daemon.stop)
        stopper.start()
        final = watch.next()
        assert final["event"] == "closed" and final["data"]["last_event_id"] is None
        try:
            watch.next()
        except EOFError:
            pass
        else:
            raise AssertionError("the stream went on after closed")
        stopper.join(timeout=60)
    assert not daemon.thread.is_alive()
