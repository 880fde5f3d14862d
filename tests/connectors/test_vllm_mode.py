"""A daemon in vLLM mode through its REST API: discovery, the host view, what it refuses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agentpark.config import Settings
from tests.conftest import Daemon


def test_a_vllm_daemon_names_its_socket_and_refuses_generate(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    shm_dir: Path,
) -> None:
    settings = make_settings(
        vllm={"enabled": True, "pool_capacity": 1 << 20, "pool_path": shm_dir / "pool"}
    )
    client = daemon_factory(settings).client
    info = client.get("/v1/vllm").json()
    assert info["protocol"] == 1 and Path(info["control_socket"]).is_socket()
    host = client.get("/v1/host").json()
    assert host["dma_backend"] == "external" and host["ready"]
    client.post("/v1/sessions", json={"session_id": "s"})
    refused = client.post(
        "/v1/sessions/s/generate", json={"prompt_tokens": [1, 2], "max_new_tokens": 1}
    )
    assert refused.status_code == 409
    assert "vLLM" in refused.json()["error"]["message"]


def test_a_reference_daemon_says_it_serves_no_vllm(daemon: Daemon) -> None:
    client = daemon.client
    answer = client.get("/v1/vllm")
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "invalid_state"
