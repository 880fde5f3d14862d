"""``register`` with any layout, and a refused one that leaves the daemon as it was.

Reproducers of issue 18 item 4: an 80-array layout was refused ("shm tier header does not
fit in 4096 bytes") after the old pool file had been closed and moved aside, so the daemon
lost its pool and closed descriptors that belonged to other sockets; every register with
another layout left a full-size ``.mismatch`` file in /dev/shm.
"""

from __future__ import annotations

import resource
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agentpark.cleanup import MOVED, find_tier_files
from agentpark.connectors.protocol import Layout, PoolFile
from agentpark.enums import State
from tests.connectors.conftest import TENANT, ControlDaemon, control_daemon  # noqa: F401
from tests.control.test_control import BLOCK, LAYOUT, Worker


@pytest.fixture
def daemon(control_daemon: ControlDaemon) -> ControlDaemon:  # noqa: F811
    """The daemon's vLLM side over its real control socket (tests/connectors/conftest.py)."""
    return control_daemon


ARRAYS_80 = Layout(
    model_uid="vllm:deep:torch.bfloat16:80",
    block_size=BLOCK,
    num_blocks=64,
    arrays=tuple(((1, 1, BLOCK, 1, 4), "uint16") for _ in range(80)),  # a 4.3 KiB header
    kv_dtype="torch.bfloat16",
)


def _register(daemon: ControlDaemon, layout: Layout) -> tuple[PoolFile, Worker]:
    answer = daemon.call("register", layout=layout.to_wire())
    assert answer["ok"], answer
    pool = PoolFile.from_wire(answer["pool"])
    return pool, Worker(pool, layout)


def _park(
    daemon: ControlDaemon, worker: Worker, sid: str, tokens: list[int]
) -> tuple[dict[str, object], list[np.ndarray]]:
    plan = daemon.plan_park(sid, tokens, list(range(10, 10 + len(tokens) // BLOCK)))
    slots = plan["slots"]
    assert isinstance(slots, list)
    rows = worker.write(slots, seed=len(sid))
    done = daemon.call(
        "complete_store", store_id=plan["store_id"], ok=True, digests=worker.digests(slots)
    )
    assert done["decision"] == "parked", done
    return plan, rows


def _load_is_bit_exact(
    daemon: ControlDaemon, worker: Worker, sid: str, tokens: list[int], rows: list[np.ndarray]
) -> None:
    turn2 = [*tokens, 5]
    n = len(tokens) // BLOCK
    load = daemon.call(
        "begin_load", turn2, tenant=TENANT, session_id=sid, start_block=0, block_ids=[1] * n
    )
    assert load["ok"], load
    for arr, before in zip(worker.arrays, rows, strict=True):
        assert np.array_equal(arr[load["slots"]], before)
    assert load["digests"] == worker.digests(load["slots"])
    done = daemon.call("load_done", load_id=load["load_id"], ok=True)
    assert done["restored_from"] == "shm", done


def test_an_80_array_layout_makes_a_pool_that_parks_and_loads_bit_exact(
    daemon: ControlDaemon,
) -> None:
    pool, worker = _register(daemon, ARRAYS_80)
    assert Path(pool.path).stat().st_size == pool.file_bytes
    assert len(pool.offsets) == 80 and pool.offsets[0] > 4096  # the header grew
    tokens = list(range(1, 1 + 3 * BLOCK))
    _, rows = _park(daemon, worker, "deep", tokens)
    _load_is_bit_exact(daemon, worker, "deep", tokens, rows)


@pytest.fixture
def file_size_limit() -> Iterator[None]:
    """This process may not grow a file past 512 KiB (a real kernel refusal: EFBIG),
    smaller than the 1 MiB pool: every new pool file fails to be made."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a core dump
    resource.setrlimit(resource.RLIMIT_FSIZE, (512 << 10, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


def test_a_refused_register_leaves_the_daemon_serving_the_old_pool(
    daemon: ControlDaemon, request: pytest.FixtureRequest
) -> None:
    pool, worker = _register(daemon, LAYOUT)
    tier = daemon.service.tier
    tokens = list(range(3, 3 + 2 * BLOCK))
    _, rows = _park(daemon, worker, "kept", tokens)
    folder = Path(pool.path).parent
    before = sorted(p.name for p in folder.iterdir())
    inode = Path(pool.path).stat().st_ino

    request.getfixturevalue("file_size_limit")
    refused = daemon.call("register", layout=ARRAYS_80.to_wire())
    refused_again = daemon.call("register", layout=ARRAYS_80.to_wire())
    resource.setrlimit(resource.RLIMIT_FSIZE, resource.getrlimit(resource.RLIMIT_FSIZE)[1:] * 2)

    for answer in (refused, refused_again):
        assert not answer["ok"] and "layout refused" in answer["error"], answer
    assert daemon.service.tier is tier and tier is not None  # exactly as it was
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing made, nothing aside
    assert Path(pool.path).stat().st_ino == inode
    assert daemon.service.driver.core.get(TENANT, "kept").state == State.PARKED
    again, _ = _register(daemon, LAYOUT)
    assert again == pool
    _load_is_bit_exact(daemon, worker, "kept", tokens, rows)


def test_layouts_that_keep_changing_leave_one_moved_aside_file_cleanup_counts(
    daemon: ControlDaemon,
) -> None:
    other = Layout(LAYOUT.model_uid + "-other", BLOCK, 64, LAYOUT.arrays, LAYOUT.kv_dtype)
    pools = [_register(daemon, layout)[0] for layout in (LAYOUT, other, LAYOUT, other, LAYOUT)]
    assert len({p.pool_id for p in pools}) == 5  # a new file each time
    path = Path(pools[-1].path)
    aside = [p for p in path.parent.iterdir() if p.name.startswith(path.name + ".")]
    assert len(aside) == 1 and ".mismatch-" in aside[0].name, aside
    found = find_tier_files([path.parent], shm_root=path.parent)
    kinds = {f.path.name: f.kind for f in found}
    assert kinds[aside[0].name] == MOVED and kinds[path.name] != MOVED
