"""A daemon in vLLM mode through its REST API: discovery, the host view, what it refuses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agentpark.config import Settings
from agentpark.connectors.protocol import PROTOCOL
from tests.harness import Daemon


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
    assert info["protocol"] == PROTOCOL and Path(info["control_socket"]).is_socket()
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


def test_a_vllm_daemon_runs_its_policy_loop_and_demotes_pool_copies_to_disk(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    shm_dir: Path,
    tmp_path: Path,
) -> None:
    from agentpark.connectors.client import ControlClient
    from agentpark.connectors.protocol import PoolFile, encode_tokens
    from tests.control.test_control import BLOCK, LAYOUT, Worker
    from tests.harness import wait_until

    settings = make_settings(
        vllm={"enabled": True, "pool_capacity": 1 << 20, "pool_path": shm_dir / "pool"},
        tiers={"disk": {"capacity": 1 << 20, "path": tmp_path / "disk.bin"}},
        policy={"demote_after_s": {"shm": 0.0}},  # demoted on the loop's next tick
    )
    daemon = daemon_factory(settings)
    assert daemon.runtime.policy.engine_rules is False
    socket_path = daemon.client.get("/v1/vllm").json()["control_socket"]
    client = ControlClient(None, socket_path=socket_path)
    try:
        registered = client.call("register", b"", wait_s=10.0, layout=LAYOUT.to_wire())
        assert registered is not None and registered["ok"], registered
        worker = Worker(PoolFile.from_wire(registered["pool"]), LAYOUT)
        tokens = list(range(2 * BLOCK))
        plan = client.call(
            "prepare_store",
            encode_tokens(tokens),
            wait_s=10.0,
            tenant="default",
            session_id="s",
            block_ids=[1, 2],
            expected_resume_s=60.0,
        )
        assert plan is not None and plan["decision"] == "parked", plan
        worker.write(plan["slots"], seed=0)
        done = client.call(
            "complete_store",
            b"",
            wait_s=10.0,
            store_id=plan["store_id"],
            ok=True,
            digests=worker.digests(plan["slots"]),
        )
        assert done is not None and done["decision"] == "parked", done

        def on_disk() -> bool:
            return bool(daemon.client.get("/v1/sessions/s").json()["tier"] == "disk")

        wait_until(on_disk)
        events = daemon.client.get("/v1/events", params={"session_id": "s"}).json()["events"]
        assert (events[0]["kind"], events[0]["reason"]) == ("move", "demote")
    finally:
        client.close()


def test_v1_vllm_says_when_the_engine_holds_the_parked_bytes_itself(
    make_settings: Callable[..., Settings],
    daemon_factory: Callable[[Settings], Daemon],
    shm_dir: Path,
) -> None:
    from agentpark.connectors.client import ControlClient
    from agentpark.connectors.protocol import Held, Layout

    settings = make_settings(
        vllm={"enabled": True, "pool_capacity": 1 << 20, "pool_path": shm_dir / "pool"}
    )
    daemon = daemon_factory(settings)
    assert daemon.client.get("/v1/vllm").json()["pool_held_by"] is None
    layout = Layout("vllm:m:jax.bfloat16:0", 16, 64, (((16, 4, 64), "uint16"),), "jax.bfloat16")
    client = ControlClient(None, socket_path=daemon.client.get("/v1/vllm").json()["control_socket"])
    held = Held("tpu_sync", "mem-1", 10)
    answer = client.call("register", layout=layout.to_wire(), held=held.to_wire(), wait_s=10.0)
    client.close()
    assert answer is not None and answer["ok"], answer
    info = daemon.client.get("/v1/vllm").json()
    assert info["pool_held_by"] == "tpu_sync"
    assert info["pool_capacity_bytes"] == 10 * 16 * 4 * 64 * 2
    assert not Path(info["pool_path"]).exists()
