"""A vLLM session moved between two vLLM-mode daemons: the target's vLLM restores it from
the imported blocks (match and begin_load over the target's control socket; the worker
is the tests' stand-in that maps the pool file)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from agentpark.config import Settings
from agentpark.connectors.client import ControlClient
from agentpark.connectors.protocol import encode_tokens
from agentpark.control.pool import PoolFile
from tests.control.test_control import BLOCK, LAYOUT, Worker
from tests.harness import Daemon
from tests.moving.pair import admin, pair_settings


def _vllm_daemon(
    tmp_path: Path, shm_dir: Path, name: str, factory: Callable[[Settings], Daemon]
) -> tuple[Daemon, str, ControlClient, Worker]:
    vllm = {"enabled": True, "pool_capacity": 1 << 20, "pool_path": shm_dir / f"pool-{name}"}
    daemon = factory(pair_settings(tmp_path, shm_dir, name, vllm=vllm))
    token = admin(daemon)
    assert daemon.runtime.vllm is not None
    socket_path = str(daemon.runtime.vllm.socket_path)
    client = ControlClient(None, token=token, socket_path=socket_path, timeout_s=10)
    answer = client.call("register", b"", wait_s=10.0, layout=LAYOUT.to_wire())
    assert answer is not None and answer["ok"], answer
    return daemon, token, client, Worker(PoolFile.from_wire(answer["pool"]), LAYOUT)


def test_a_vllm_session_moved_is_loaded_by_the_targets_vllm_bit_exact(
    tmp_path: Path, shm_dir: Path, daemon_factory: Callable[[Settings], Daemon]
) -> None:
    a, _, on_a, worker_a = _vllm_daemon(tmp_path, shm_dir, "a", daemon_factory)
    b, b_token, on_b, worker_b = _vllm_daemon(tmp_path, shm_dir, "b", daemon_factory)
    try:
        tokens = list(range(3, 3 + 3 * BLOCK))
        blob = encode_tokens(tokens)
        plan = on_a.call(
            "prepare_store",
            blob,
            wait_s=10.0,
            tenant="default",
            session_id="agent",
            block_ids=[100, 101, 102],
            tool="search",
            expected_resume_s=60.0,
        )
        assert plan is not None and plan["decision"] == "parked", plan
        rows = worker_a.write(plan["slots"], seed=5)
        done = on_a.call(
            "complete_store",
            b"",
            wait_s=10.0,
            store_id=plan["store_id"],
            ok=True,
            digests=worker_a.digests(plan["slots"]),
        )
        assert done is not None and done["decision"] == "parked", done

        body = {"session_id": "agent", "to": b.url, "to_token": b_token}
        moved = a.client.post("/v1/moves", json=body)
        assert moved.status_code == 200, moved.text
        assert moved.json()["blocks_sent"] == 3
        assert a.client.get("/v1/sessions/agent").status_code == 404

        turn2 = encode_tokens([*tokens, 7, 8])
        fields = {"tenant": "default", "session_id": "agent"}
        match = on_b.call("match", turn2, wait_s=10.0, num_computed=0, **fields)
        assert match is not None and match["tokens"] == 3 * BLOCK, match
        load = on_b.call(
            "begin_load", turn2, wait_s=10.0, start_block=0, block_ids=[7, 8, 9], **fields
        )
        assert load is not None and load["ok"], load
        for arr, parked in zip(worker_b.arrays, rows, strict=True):
            assert np.array_equal(arr[load["slots"]], parked)  # what A's vLLM parked
        assert worker_b.digests(load["slots"]) == load["digests"]
        finished = on_b.call("load_done", b"", wait_s=10.0, load_id=load["load_id"], ok=True)
        assert finished is not None and finished["restored_tokens"] == 3 * BLOCK
    finally:
        on_a.close()
        on_b.close()
