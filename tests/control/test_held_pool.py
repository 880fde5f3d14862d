"""The daemon's side of a pool whose bytes the worker holds (vLLM on TPU, TPU Sync).

Through the real control socket and VllmService (SQLite file, /dev/shm paths); the worker
is the protocol's messages only: TPU Sync's real copies are in tests/connectors/tpu_real.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from agentpark.connectors.protocol import Held, Layout, PoolFile
from agentpark.enums import State
from agentpark.tiers.base import BackendHeldTier
from tests.connectors.conftest import TENANT, ControlDaemon

BLOCK = 16
LAYOUT = Layout(
    model_uid="vllm:tiny:jax.bfloat16:abc",
    block_size=BLOCK,
    num_blocks=64,
    arrays=(((BLOCK, 4, 64), "uint16"), ((BLOCK, 4, 64), "uint16")),
    kv_dtype="jax.bfloat16",
)
HELD = Held("tpu_sync", "shm-" + "a" * 32, 24)


def _register(daemon: ControlDaemon, held: Held = HELD, layout: Layout = LAYOUT) -> dict[str, Any]:
    answer = daemon.call("register", layout=layout.to_wire(), held=held.to_wire())
    assert answer["ok"], answer
    return dict(answer["held"])


def _park(daemon: ControlDaemon, session_id: str, tokens: list[int]) -> dict[str, Any]:
    blocks = list(range(30, 30 + len(tokens) // BLOCK))
    plan = daemon.plan_park(session_id, tokens, blocks)
    # A worker that sent digests anyway: a held pool never records one.
    digests = ["xxh3b:00"] * len(plan["slots"])
    done = daemon.call(
        "complete_store", store_id=plan["store_id"], ok=True, digests=digests, detail=None
    )
    assert done["decision"] == "parked", done
    return plan


def test_a_held_registration_makes_no_pool_file_and_records_the_layout_privately(
    control_daemon: ControlDaemon,
) -> None:
    daemon = control_daemon
    answer = _register(daemon)
    assert answer == {
        "pool_id": f"tpu_sync:{HELD.instance}",
        "capacity_blocks": 24,
        "kept": False,
        "checksum": False,
    }
    service = daemon.service
    assert not service.pool_path.exists()  # no data file: TPU Sync holds the bytes
    assert stat.S_IMODE(os.stat(service.held_path).st_mode) == 0o600
    tier = service.tier
    assert isinstance(tier, BackendHeldTier) and tier.capacity_blocks == 24
    assert tier.name == "shm" and service.disk is None
    again = _register(daemon)
    assert again["kept"] and again["pool_id"] == answer["pool_id"]


def test_a_parked_copy_in_a_held_pool_claims_no_checksum_and_loads_by_its_slots(
    control_daemon: ControlDaemon,
) -> None:
    daemon = control_daemon
    pool_id = _register(daemon)["pool_id"]
    tokens = list(range(1, 1 + 3 * BLOCK))
    plan = _park(daemon, "agent-1", tokens)
    assert plan["checksum"] is False and plan["pool_id"] == pool_id
    row = daemon.service.driver.core.get(TENANT, "agent-1")
    assert (row.state, row.tier, row.checksum) == (State.PARKED, "shm", None)
    turn2 = [*tokens, 5]
    load = daemon.call(
        "begin_load", turn2, tenant=TENANT, session_id="agent-1", start_block=0, block_ids=[1, 2, 3]
    )
    assert load["ok"] and load["digests"] == [None] * 3 and load["slots"] == plan["slots"]
    done = daemon.call("load_done", load_id=load["load_id"], ok=True)
    assert done["restored_tokens"] == 3 * BLOCK and done["restored_from"] == "shm"


def test_a_daemon_restart_keeps_held_copies_and_a_new_instance_loses_them(
    control_daemon: ControlDaemon,
) -> None:
    daemon = control_daemon
    pool_id = _register(daemon)["pool_id"]
    tokens = list(range(7, 7 + 2 * BLOCK))
    plan = _park(daemon, "s", tokens)
    daemon.restart()
    # From the record: the worker, still running, holds the bytes; nothing to re-register.
    service = daemon.service
    assert isinstance(service.tier, BackendHeldTier) and service.pool_id == pool_id
    assert service.driver.core.get(TENANT, "s").state == State.PARKED
    match = daemon.call("match", [*tokens, 1], tenant=TENANT, session_id="s", num_computed=0)
    assert match["tokens"] == 2 * BLOCK
    assert _register(daemon)["kept"]  # the worker restarted and re-attached its segments
    assert service.driver.core.get(TENANT, "s").state == State.PARKED
    assert service.tier is not None and service.tier.used_blocks == len(plan["slots"])

    # A load in flight when the worker comes back with new host memory is failed first.
    load = daemon.call(
        "begin_load", [*tokens, 1], tenant=TENANT, session_id="s", start_block=0, block_ids=[4, 5]
    )
    assert load["ok"]
    fresh = Held("tpu_sync", "mem-" + "b" * 32, 24)
    answer = _register(daemon, fresh)
    assert not answer["kept"] and answer["pool_id"] == f"tpu_sync:{fresh.instance}"
    row = service.driver.core.get(TENANT, "s")
    assert row.state == State.LOST and "host memory is new" in (row.lost_reason or "")
    assert service.tier is not None and service.tier.used_blocks == 0
    late = daemon.call("load_done", load_id=load["load_id"], ok=True)
    assert late["restored_tokens"] == 0  # the plan was failed at the registration


def test_held_and_file_registrations_replace_each_other_loudly(
    control_daemon: ControlDaemon,
) -> None:
    daemon = control_daemon
    file_layout = Layout(
        LAYOUT.model_uid.replace("jax", "torch"), BLOCK, 64, LAYOUT.arrays, "torch.bfloat16"
    )
    answer = daemon.call("register", layout=file_layout.to_wire())
    pool = PoolFile.from_wire(answer["pool"])
    _park(daemon, "on-file", list(range(BLOCK)))
    _register(daemon)
    moved = list(Path(pool.path).parent.glob(Path(pool.path).name + ".mismatch-*"))
    assert moved, "the old file is moved aside, never deleted"
    assert daemon.service.driver.core.get(TENANT, "on-file").state == State.LOST

    _park(daemon, "held", list(range(BLOCK)))
    answer = daemon.call("register", layout=file_layout.to_wire())
    assert answer["ok"] and Path(answer["pool"]["path"]).exists()
    assert not daemon.service.held_path.exists()
    row = daemon.service.driver.core.get(TENANT, "held")
    assert row.state == State.LOST and "pool file" in (row.lost_reason or "")


def test_a_bad_held_is_refused_as_an_answer(control_daemon: ControlDaemon) -> None:
    daemon = control_daemon
    for held, why in (
        ({"backend": "nvme", "instance": "x", "capacity_blocks": 4}, "held.backend must be"),
        ({"backend": "tpu_sync", "instance": "../x", "capacity_blocks": 4}, "held.instance"),
        ({"backend": "tpu_sync", "instance": "x", "capacity_blocks": 0}, "capacity_blocks"),
        ({"backend": "tpu_sync"}, "held.instance: Field required"),
        ("tpu_sync", "held: Input should be a valid dictionary"),
    ):
        answer = daemon.call("register", layout=LAYOUT.to_wire(), held=held)
        assert not answer["ok"] and answer["cause"] == "bad_request", answer
        assert why in answer["error"], answer
    assert daemon.service.tier is None and not daemon.service.held_path.exists()
