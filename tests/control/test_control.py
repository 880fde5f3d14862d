"""The daemon's side of vLLM, through its real control socket, with a numpy stand-in worker.

``Worker`` plays the connector's worker process: it maps the daemon's real /dev/shm pool
file with numpy (as the real one does with torch), writes and reads block bytes there, and
checksums them with agentpark.integrity. The daemon's side is the real VllmService: SQLite
file, shm tier, control server on a unix socket, and the connector's own ControlClient.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agentpark.blocks import ArraySpec, PoolGeometry
from agentpark.connectors.client import ControlClient
from agentpark.connectors.protocol import Layout, PoolFile, encode_tokens
from agentpark.control.server import Connection
from agentpark.enums import State
from agentpark.integrity import block_digests
from agentpark.tiers.base import HostTier
from tests.connectors.conftest import TENANT, ControlDaemon

BLOCK = 16
LAYOUT = Layout(
    model_uid="vllm:tiny:torch.bfloat16:abc",
    block_size=BLOCK,
    num_blocks=64,
    arrays=(((2, BLOCK, 8), "uint16"), ((2, BLOCK, 8), "uint16")),
    kv_dtype="torch.bfloat16",
)


class _View:
    def __init__(self, geometry: PoolGeometry, buffers: list[np.ndarray]) -> None:
        self.geometry = geometry
        self._buffers = buffers

    def buffers(self) -> list[np.ndarray]:
        return self._buffers


class Worker:
    """STAND-IN for the connector's worker: the pool file mapped with numpy."""

    def __init__(self, pool: PoolFile, layout: Layout) -> None:
        self.pool = pool
        self.geometry = PoolGeometry(
            layout.num_blocks,
            layout.block_size,
            tuple(ArraySpec(s, d) for s, d in layout.arrays),
        )
        self.arrays = [
            np.memmap(
                pool.path,
                dtype=spec.dtype,
                mode="r+",
                offset=offset,
                shape=(pool.capacity_blocks, *spec.block_shape),
            )
            for spec, offset in zip(self.geometry.arrays, pool.offsets, strict=True)
        ]

    def write(self, slots: list[int], seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        rows = []
        for arr in self.arrays:
            data = rng.integers(0, 60_000, (len(slots), *arr.shape[1:])).astype(arr.dtype)
            arr[slots] = data
            rows.append(data)
        return rows

    def digests(self, slots: list[int]) -> list[str]:
        view = _View(self.geometry, [np.asarray(a) for a in self.arrays])
        tier: HostTier = view  # type: ignore[assignment]  # integrity reads geometry, buffers
        return block_digests(tier, slots)


Daemon = ControlDaemon


@pytest.fixture
def daemon(control_daemon: ControlDaemon) -> ControlDaemon:
    return control_daemon


def _register(daemon: Daemon, layout: Layout = LAYOUT) -> tuple[PoolFile, Worker]:
    answer = daemon.call("register", layout=layout.to_wire())
    assert answer["ok"], answer
    pool = PoolFile.from_wire(answer["pool"])
    return pool, Worker(pool, layout)


def _park(
    daemon: Daemon, worker: Worker, session_id: str, tokens: list[int], seed: int = 0
) -> tuple[dict[str, Any], list[np.ndarray]]:
    blocks = list(range(100, 100 + len(tokens) // BLOCK))
    answer = daemon.plan_park(session_id, tokens, blocks)
    rows = worker.write(answer["slots"], seed)
    done = daemon.call(
        "complete_store",
        store_id=answer["store_id"],
        ok=True,
        digests=worker.digests(answer["slots"]),
    )
    assert done["decision"] == "parked", done
    return answer, rows


def test_the_socket_and_pool_file_are_private_and_the_header_names_the_layout(
    daemon: Daemon,
) -> None:
    pool, _ = _register(daemon)
    assert stat.S_IMODE(os.stat(daemon.service.socket_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(pool.path).st_mode) == 0o600
    again, _ = _register(daemon)
    assert again == pool  # the same layout re-attaches the same file
    hello = daemon.call("hello")  # the client said it when it connected: once only
    assert not hello["ok"] and hello["cause"] == "bad_request"
    assert daemon.client.tenant == TENANT


def test_a_two_phase_park_then_a_load_restores_the_parked_bytes(daemon: Daemon) -> None:
    _, worker = _register(daemon)
    tokens = list(range(1, 3 * BLOCK + 5))[: 3 * BLOCK]  # three whole blocks
    store, rows = _park(daemon, worker, "agent-1", tokens)
    row = daemon.service.driver.core.get(TENANT, "agent-1")
    assert row.state == State.PARKED and row.tier == "shm" and row.kv_blocks == 3

    turn2 = [*tokens, 7, 8, 9]
    match = daemon.call("match", turn2, tenant=TENANT, session_id="agent-1", num_computed=0)
    assert match["tokens"] == 3 * BLOCK
    # vLLM's own cache has block 0: only blocks 1 and 2 come from agentpark.
    partial = daemon.call("match", turn2, tenant=TENANT, session_id="agent-1", num_computed=BLOCK)
    assert partial["tokens"] == 2 * BLOCK
    load = daemon.call(
        "begin_load",
        turn2,
        tenant=TENANT,
        session_id="agent-1",
        start_block=1,
        block_ids=[7, 8, 9],
    )
    assert load["ok"], load
    assert load["slots"] == store["slots"][1:]
    assert load["digests"] == worker.digests(store["slots"])[1:]
    for arr, before in zip(worker.arrays, rows, strict=True):
        assert np.array_equal(arr[load["slots"]], before[1:])  # the bytes it parked
    assert daemon.service.driver.core.get(TENANT, "agent-1").state == State.RESUMING
    done = daemon.call("load_done", load_id=load["load_id"], ok=True)
    assert done["restored_tokens"] == 2 * BLOCK and done["restored_from"] == "shm"
    core = daemon.service.driver.core
    assert core.get(TENANT, "agent-1").state == State.ACTIVE
    assert core.counters.prefill_tokens_avoided == 2 * BLOCK
    # No session holds the blocks now; the pool keeps them by content until room is needed.
    assert daemon.service.tier is not None and daemon.service.tier.used_blocks == 0
    assert daemon.service.tier.cached_blocks == 3
    # The pause ends at the next request's match (protocol 4), before the load.
    assert daemon.kinds("agent-1") == ["create", "turn", "pause", "tool_return", "resume"]


def test_a_short_pause_is_kept_and_nothing_is_reserved(daemon: Daemon) -> None:
    _register(daemon)
    tokens = list(range(2 * BLOCK))
    answer = daemon.call(
        "prepare_store",
        tokens,
        tenant=TENANT,
        session_id="quick",
        block_ids=[1, 2],
        expected_resume_s=0.1,
    )
    assert answer["ok"] and answer["decision"] == "kept" and "break-even" in answer["why"]
    assert daemon.service.tier is not None and daemon.service.tier.used_blocks == 0


def test_a_copy_the_worker_reports_damaged_is_dropped_and_counted_as_recomputed(
    daemon: Daemon,
) -> None:
    _, worker = _register(daemon)
    tokens = list(range(50, 50 + 2 * BLOCK))
    store, _ = _park(daemon, worker, "s", tokens)
    worker.arrays[0][store["slots"][0]].flat[5] ^= 1  # one flipped bit
    turn2 = [*tokens, 1]
    load = daemon.call(
        "begin_load", turn2, tenant=TENANT, session_id="s", start_block=0, block_ids=[3, 4]
    )
    assert worker.digests(load["slots"]) != load["digests"]  # what the worker sees
    done = daemon.call("load_done", load_id=load["load_id"], ok=False, cause="checksum")
    assert done["restored_tokens"] == 0
    kinds = daemon.kinds("s")
    assert kinds[-3:] == ["corrupt", "recompute", "tool_return"]
    assert daemon.service.driver.core.get(TENANT, "s").state == State.ACTIVE
    assert daemon.service.tier is not None and daemon.service.tier.used_blocks == 0
    assert daemon.service.degraded["load_checksum"] == 1


def test_a_store_the_engine_never_finishes_is_failed_and_its_slots_freed(
    daemon: Daemon,
) -> None:
    _register(daemon)
    answer = daemon.call(
        "prepare_store",
        list(range(BLOCK)),
        tenant=TENANT,
        session_id="s",
        block_ids=[5],
        expected_resume_s=60.0,
    )
    assert daemon.service.driver.core.get(TENANT, "s").state == State.PAUSING
    # A turn arriving mid-save finds nothing loadable: the copy is not committed yet.
    assert (
        daemon.call("match", list(range(BLOCK + 1)), tenant=TENANT, session_id="s", num_computed=0)[
            "tokens"
        ]
        == 0
    )
    assert daemon.service.driver.expire(0.0) == 1
    row = daemon.service.driver.core.get(TENANT, "s")
    assert row.state == State.ACTIVE and "pause_failed" in daemon.kinds("s")
    assert daemon.service.tier is not None and daemon.service.tier.used_blocks == 0
    late = daemon.call("complete_store", store_id=answer["store_id"], ok=True, digests=["xxh3b:0"])
    assert late["decision"] == "not_parked"  # too late: not parked


def test_parked_sessions_survive_a_daemon_restart_and_load_after_it(daemon: Daemon) -> None:
    pool, worker = _register(daemon)
    tokens = list(range(9, 9 + 2 * BLOCK))
    store, _ = _park(daemon, worker, "s", tokens)
    daemon.restart()
    assert daemon.service.driver.core.get(TENANT, "s").state == State.PARKED
    again, _ = _register(daemon)
    assert again.pool_id == pool.pool_id  # the same file, re-attached
    turn2 = [*tokens, 1]
    assert (
        daemon.call("match", turn2, tenant=TENANT, session_id="s", num_computed=0)["tokens"]
        == 2 * BLOCK
    )
    load = daemon.call(
        "begin_load", turn2, tenant=TENANT, session_id="s", start_block=0, block_ids=[1, 2]
    )
    assert load["slots"] == store["slots"] and load["digests"] == worker.digests(load["slots"])


def test_another_layout_refuses_the_old_pool_and_its_sessions_are_lost(daemon: Daemon) -> None:
    pool, worker = _register(daemon)
    _park(daemon, worker, "s", list(range(BLOCK)))
    other = Layout(LAYOUT.model_uid + "-other", BLOCK, 64, LAYOUT.arrays, LAYOUT.kv_dtype)
    fresh, _ = _register(daemon, other)
    assert fresh.pool_id != pool.pool_id
    moved = list(Path(pool.path).parent.glob(Path(pool.path).name + ".mismatch-*"))
    assert moved, "the old file is moved aside, never deleted"
    row = daemon.service.driver.core.get(TENANT, "s")
    assert row.state == State.LOST and "layout changed" in (row.lost_reason or "")


def test_refusals_are_answers_and_a_full_pool_is_counted(daemon: Daemon) -> None:
    assert (
        daemon.call(
            "prepare_store",
            list(range(BLOCK)),
            tenant=TENANT,
            session_id="s",
            block_ids=[1],
            expected_resume_s=60.0,
        )["ok"]
        is False
    )  # no engine yet
    _register(daemon)
    capacity = daemon.service.tier.capacity_blocks if daemon.service.tier else 0
    tokens = list(range((capacity + 1) * BLOCK))
    full = daemon.call(
        "prepare_store",
        tokens,
        tenant=TENANT,
        session_id="big",
        block_ids=list(range(capacity + 1)),
        expected_resume_s=60.0,
    )
    assert full["ok"] is False and full["cause"] == "pool_full"
    assert daemon.service.degraded["pool_full"] >= 1
    bad = daemon.call(
        "prepare_store",
        list(range(BLOCK)),
        tenant=TENANT,
        session_id="bad id!",
        block_ids=[1],
        expected_resume_s=60.0,
    )
    assert bad["ok"] is False and bad["cause"] == "bad_request"
    unknown = daemon.call("no_such_op")
    assert unknown["ok"] is False and unknown["cause"] == "bad_request"
    busy_free = daemon.call(
        "begin_load", [1, 2], tenant=TENANT, session_id="nobody", start_block=0, block_ids=[1]
    )
    assert busy_free["ok"] is False


def test_degraded_counts_made_while_the_daemon_was_away_reach_it(
    daemon: Daemon, tmp_path: Path
) -> None:
    absent = ControlClient(None, socket_path=str(tmp_path / "nobody.sock"), who="test")
    assert absent.call("hello") is None
    assert absent.counts["daemon_unreachable"] == 1
    assert absent.call("hello") is None  # within the back-off: degraded at once
    assert absent.counts["daemon_unreachable"] == 2
    # The same client, once it reaches a daemon, sends what it counted.
    late = ControlClient(
        None, socket_path=str(daemon.service.socket_path), who="test", timeout_s=10
    )
    late.degraded("daemon_unreachable", "while it was away")
    late.degraded("daemon_unreachable", "while it was away")
    assert late.call("hello") is not None
    assert daemon.service.degraded["daemon_unreachable"] == 2
    late.close()


def test_a_call_after_a_daemon_restart_reconnects_at_once(daemon: Daemon) -> None:
    # A roomy time-out: this is about the stale connection, not about how fast a loaded
    # machine answers (a time-out would count as degraded too).
    socket_path = str(daemon.service.socket_path)
    client = ControlClient(None, socket_path=socket_path, who="test", timeout_s=10)
    assert client.call("hello") is not None
    daemon.restart()
    assert client.call("hello") is not None  # the stale connection is replaced, not degraded
    assert not client.counts
    client.close()


def test_a_park_whose_answer_the_connector_gave_up_on_is_undone_at_once(
    daemon: Daemon,
) -> None:
    import threading

    from tests.harness import wait_until

    _register(daemon)
    release = threading.Event()
    handle = daemon.service.server.handler

    def slow(
        conn: Connection, message: dict[str, Any], blob: bytes
    ) -> tuple[dict[str, Any], bytes]:
        answer = handle(conn, message, blob)
        if message.get("op") == "prepare_store":
            release.wait(10)  # answered only after the connector has stopped waiting
        return answer

    daemon.service.server.handler = slow
    impatient = ControlClient(None, socket_path=str(daemon.service.socket_path), timeout_s=0.05)
    # Connected (hello answered) with room to spare: only the park below is to time out.
    assert impatient.call(
        "match", encode_tokens([1, 2]), session_id="other", num_computed=0, wait_s=10
    )
    answer = impatient.call(
        "prepare_store",
        encode_tokens(list(range(BLOCK))),
        tenant=TENANT,
        session_id="late",
        block_ids=[3],
        expected_resume_s=60.0,
    )
    assert answer is None and impatient.counts["slow"] == 1
    release.set()
    core = daemon.service.driver.core
    # The undo's event, not only the state: under load the handler may not even have made
    # the session when the connector gave up, and a new session is ACTIVE too.
    wait_until(lambda: "pause_failed" in daemon.kinds("late"), timeout=10)
    assert core.get(TENANT, "late").state == State.ACTIVE
    assert daemon.service.driver.pending() == (0, 0)
    assert daemon.service.tier is not None and daemon.service.tier.used_blocks == 0
    impatient.close()
