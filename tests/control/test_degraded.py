"""Degraded counts (agentpark.control.degraded) through a real daemon in vLLM mode: a fixed
set of causes on /metrics whatever a connector sends, and each tenant's own on /v1/vllm."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agentpark.config import Settings
from agentpark.control.degraded import DegradedCause
from tests.control.harness import Raw
from tests.harness import Daemon, bearer


def _vllm_daemon(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    shm_dir: Path,
) -> Daemon:
    return daemon_factory(
        make_settings(
            vllm={"enabled": True, "pool_capacity": 1 << 20, "pool_path": shm_dir / "pool"}
        )
    )


def _series(daemon: Daemon) -> dict[str, float]:
    scraped = daemon.client.get("/metrics")
    assert scraped.status_code == 200
    out = {}
    for line in scraped.text.splitlines():
        if line.startswith("agentpark_vllm_degraded_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('cause="')[1].split('"')[0]] = float(value)
    return out


def test_no_cause_a_connector_sends_can_break_or_flood_metrics(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    shm_dir: Path,
) -> None:
    daemon = _vllm_daemon(make_settings, daemon_factory, shm_dir)
    conn = Raw(daemon.client.get("/v1/vllm").json()["control_socket"])
    conn.hello()  # a loopback daemon with no token: tenant default
    refused = conn.send({"op": "degraded", "counts": {"c\ud800": 1}})
    assert refused["ok"] is False and refused["cause"] == "bad_request"
    for i in range(100):
        assert conn.send({"op": "degraded", "counts": {f"made-up-{i}": 1, "timeout": 1}})["ok"]
    service = daemon.runtime.vllm
    assert service is not None
    service.count_degraded("c\ud800")  # the daemon's own path takes any text too
    series = _series(daemon)
    assert set(series) <= {c.value for c in DegradedCause}
    assert series["other"] == 101 and series["timeout"] == 100
    conn.close()


def test_v1_vllm_gives_a_token_its_own_tenants_counts_only(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    shm_dir: Path,
) -> None:
    daemon = _vllm_daemon(make_settings, daemon_factory, shm_dir)
    alpha, beta = daemon.token("alpha", "sessions"), daemon.token("beta", "sessions")
    info = daemon.client.get("/v1/vllm", headers=bearer(alpha)).json()
    conn = Raw(info["control_socket"])
    assert conn.hello(alpha)["tenant"] == "alpha"
    assert conn.send({"op": "degraded", "counts": {"timeout": 3}})["ok"]
    service = daemon.runtime.vllm
    assert service is not None
    service.count_degraded("engine_never_reported")  # the daemon's own: no tenant's
    mine = daemon.client.get("/v1/vllm", headers=bearer(alpha)).json()
    theirs = daemon.client.get("/v1/vllm", headers=bearer(beta)).json()
    assert mine["tenant"] == "alpha" and mine["degraded"] == {"timeout": 3}
    assert theirs["tenant"] == "beta" and theirs["degraded"] == {}
    series = _series(daemon)  # /metrics: every count, by cause only
    assert series["timeout"] == 3 and series["engine_never_reported"] == 1
    conn.close()
