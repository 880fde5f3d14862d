"""Failed authentication costs the caller: 429 with Retry-After past a burst of 401s per peer.

The table on its own (a clock the test turns), then a real daemon: a burst of bad tokens
from one address, a valid token from the same address, and another address (127.0.0.2,
which loopback accepts as well) asking at the same time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import httpx
import pytest

from agentpark.api.auth_limit import AuthLimiter
from agentpark.config import Settings
from tests.harness import Daemon

BAD = {"Authorization": "Bearer apk_000000000000_" + "x" * 43}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_failures_then_429_until_the_bucket_drains() -> None:
    clock, counted = Clock(), []
    limiter = AuthLimiter(3, 2.0, 100, count=counted.append, clock=clock)
    assert [limiter.failed("a") for _ in range(3)] == [None, None, None]
    retry = limiter.failed("a")
    assert retry == pytest.approx(0.5)  # one failure drains in 1 / 2.0 s
    assert limiter.failed("a") == pytest.approx(0.5)  # throttled ones are not added
    clock.now += 0.5
    assert limiter.failed("a") is None  # waited as told: a 401 again
    assert limiter.failed("a") == pytest.approx(0.5)
    assert counted == ["unauthenticated"] * 3 + ["throttled"] * 2 + ["unauthenticated"] + [
        "throttled"
    ]


def test_peers_are_counted_apart() -> None:
    limiter = AuthLimiter(2, 1.0, 100, clock=Clock())
    for _ in range(2):
        assert limiter.failed("a") is None
    assert limiter.failed("a") is not None
    assert limiter.failed("b") is None


def test_the_table_holds_at_most_max_peers_forgetting_the_oldest() -> None:
    clock = Clock()
    limiter = AuthLimiter(1, 0.001, 50, clock=clock)
    assert limiter.failed("first") is None
    for n in range(10_000):
        limiter.failed(f"10.0.{n // 256}.{n % 256}")
        assert len(limiter) <= 50
    assert len(limiter) == 50
    assert limiter.failed("first") is None  # forgotten: starts afresh
    last = f"10.0.{9999 // 256}.{9999 % 256}"
    assert limiter.failed(last) is not None  # the most recent peers are still held


def _flood(client: httpx.Client, n: int) -> list[httpx.Response]:
    return [client.get("/v1/sessions", headers=BAD) for _ in range(n)]


def test_a_burst_of_bad_tokens_gets_429_with_retry_after_and_a_valid_token_passes(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    daemon = daemon_factory(make_settings(auth={"failure_burst": 5, "failure_rate_per_s": 0.5}))
    token = daemon.token("t", "sessions")
    answers = _flood(daemon.client, 8)
    assert [a.status_code for a in answers] == [401] * 5 + [429] * 3
    throttled = answers[-1]
    assert throttled.json()["error"]["code"] == "auth_throttled"
    retry = int(throttled.headers["Retry-After"])
    assert retry == math.ceil(1 / 0.5)
    # A valid token from the same address is never throttled.
    ok = daemon.client.get("/v1/sessions", headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200
    # Another address (all of 127/8 is loopback) still gets its plain 401s.
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(base_url=daemon.url, transport=transport, timeout=30) as other:
        assert [a.status_code for a in _flood(other, 5)] == [401] * 5
        assert other.get("/v1/sessions", headers=BAD).status_code == 429
    metrics = daemon.client.get("/metrics").text
    counted = {
        line.split("answer=")[1].split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("agentpark_auth_failures_total{")
    }
    assert counted == {"unauthenticated": 10.0, "throttled": 4.0}


def test_a_request_without_a_token_counts_where_one_is_needed(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    daemon = daemon_factory(make_settings(auth={"failure_burst": 2}))
    daemon.token("t", "sessions")  # from now on every request needs a token
    codes = [daemon.client.get("/v1/sessions").status_code for _ in range(3)]
    assert codes == [401, 401, 429]


def test_the_loopback_default_is_never_throttled(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> None:
    daemon = daemon_factory(make_settings(auth={"failure_burst": 1}))
    assert daemon.client.get("/v1/sessions", headers=BAD).status_code == 401
    assert daemon.client.get("/v1/sessions", headers=BAD).status_code == 429
    assert daemon.client.get("/v1/sessions").status_code == 200  # no token: the default
