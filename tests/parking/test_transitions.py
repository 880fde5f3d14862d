"""Each edge of the state machine through agentpark.parking.transitions, and what a failed
step leaves: nothing changed (state, blocks, slots, the tally of sessions by state).

The core is real (SQLite file, a dram tier, the mover's host copy); the engine's pool is a
set of numpy arrays. A database that refuses writes is real too: SQLite's ``query_only``
on every connection, so each write fails as a full or read-only volume makes it fail.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, event

import agentpark
from agentpark.blocks import ArraySpec, PoolGeometry
from agentpark.enums import EventKind, Reason, State
from agentpark.errors import InvalidStateError, StorageUnavailableError, TierFullError
from agentpark.parking import ArrayPool, CoreOptions, ExternalManager, LiveSession, external_core
from agentpark.parking.core import SessionCore
from agentpark.store.db import open_database
from agentpark.store.migrate import upgrade
from agentpark.store.repository import SessionStore
from agentpark.tiers.dram import DramTier

BLOCK = 4
GEOMETRY = PoolGeometry(16, BLOCK, (ArraySpec((BLOCK, 8), "float32"),))
T = "t"


class Refusal:
    """Makes every write to the database fail (SQLite ``query_only``) while on."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.on = False
        event.listen(engine, "connect", self._connect)

    def _connect(self, dbapi_conn: Any, _record: Any) -> None:
        if self.on:
            dbapi_conn.execute("PRAGMA query_only = ON")

    @contextmanager
    def writes_refused(self) -> Iterator[None]:
        self.on = True
        self.engine.dispose()  # every connection from now on is read-only
        try:
            yield
        finally:
            self.on = False
            self.engine.dispose()


@dataclass
class Core:
    manager: ExternalManager
    tier: DramTier
    pool: np.ndarray
    refusal: Refusal
    store: SessionStore

    @property
    def core(self) -> SessionCore:
        return self.manager.core

    def active(self, sid: str, n_blocks: int = 2) -> LiveSession:
        """A session holding ``n_blocks`` pool blocks of distinct bytes (ACTIVE)."""
        core = self.core
        core.create(T, sid, None)
        live = core.live(T, sid)
        blocks = [3 + b for b in range(n_blocks)]
        for b in blocks:
            self.pool[b] = np.arange(BLOCK * 8, dtype=np.float32).reshape(BLOCK, 8) + b
        with core.registry.operation(live, "test"):
            pending = core.transitions.turn(live, list(range(n_blocks * BLOCK)), blocks)
            core.transitions.commit(live, *pending)
        return live

    def parked(self, sid: str) -> LiveSession:
        live = self.active(sid)
        with self.core.registry.operation(live, "test"):
            self.core.transitions.park(live, self.core.endpoint(), [self.tier], None, 5.0, "idle")
        return live

    def kinds(self, sid: str) -> list[str]:
        return [e.kind for e in reversed(self.store.events(T, sid, 100))]

    def figures(self) -> tuple[dict[str, int], int]:
        return self.core.registry.tally.figures()


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Core]:
    url = f"sqlite:///{tmp_path / 'agentpark.db'}"
    upgrade(url)
    engine, factory = open_database(url)
    store = SessionStore(engine, factory)
    pool = np.zeros((GEOMETRY.num_blocks, BLOCK, 8), dtype=np.float32)
    tier = DramTier(GEOMETRY, 4 * GEOMETRY.block_nbytes)
    manager = external_core(
        store, GEOMETRY, "m", [tier], pool=ArrayPool((pool,)), options=CoreOptions()
    )
    yield Core(manager, tier, pool, Refusal(engine), store)
    manager.core.close()
    tier.close()
    store.close()


def _held(host: Core, live: LiveSession) -> Any:
    return host.core.registry.operation(live, "test")


# ---- park ---------------------------------------------------------------------------------


def test_a_park_reserves_copies_and_commits_parked(host: Core) -> None:
    live = host.active("s")
    with _held(host, live):
        dst, slots = host.core.transitions.begin_park(live, [host.tier])
        assert live.row.state == State.PAUSING and host.figures()[0][State.PAUSING] == 1
        host.core.transitions.park_into(live, host.core.endpoint(), dst, slots, "web", 9.0, "idle")
    row = live.row
    assert (row.state, row.tier, row.kv_blocks) == (State.PARKED, "dram", 2)
    assert live.block_table == [] and live.slots == slots
    assert np.array_equal(host.tier.buffers()[0][slots[1]], host.pool[4])
    by_state, parked_bytes = host.figures()
    assert by_state[State.PARKED] == 1 and parked_bytes == 2 * GEOMETRY.block_nbytes
    assert host.kinds("s")[-1] == "pause"
    host.core.check_invariants()


def test_a_park_with_no_room_changes_nothing(host: Core) -> None:
    live = host.active("s", n_blocks=5)  # the tier holds 4
    before = host.figures()
    with _held(host, live), pytest.raises(TierFullError):
        host.core.transitions.begin_park(live, [host.tier])
    assert live.row.state == State.ACTIVE and len(live.block_table) == 5
    assert host.tier.used_blocks == 0 and host.figures() == before
    host.core.check_invariants()


def test_a_park_the_database_refuses_leaves_the_session_active_with_its_blocks(
    host: Core,
) -> None:
    live = host.active("s")
    before, blocks = host.figures(), list(live.block_table)
    refused = pytest.raises(StorageUnavailableError)
    with _held(host, live), host.refusal.writes_refused(), refused:
        host.core.transitions.park(live, host.core.endpoint(), [host.tier], None, None, "idle")
    assert live.row.state == State.ACTIVE and live.block_table == blocks
    assert live.slots == [] and host.tier.used_blocks == 0
    assert host.figures() == before and host.kinds("s")[-1] == "turn"
    host.core.check_invariants()


def test_an_aborted_park_frees_its_slots_and_says_why(host: Core) -> None:
    live = host.active("s")
    with _held(host, live):
        dst, _ = host.core.transitions.begin_park(live, [host.tier])
        host.core.transitions.abort_park(live, dst, RuntimeError("the engine's copy failed"))
    assert live.row.state == State.ACTIVE and host.tier.used_blocks == 0
    assert host.kinds("s")[-1] == EventKind.PAUSE_FAILED
    host.core.check_invariants()


def test_a_kept_pause_records_the_wait_and_stays_active(host: Core) -> None:
    live = host.active("s")
    with _held(host, live):
        host.core.transitions.keep(live, "calc", 0.5, "short")
    assert live.row.state == State.ACTIVE and live.row.tool == "calc"
    assert live.row.expected_resume_at is not None and host.kinds("s")[-1] == "keep"
    host.core.check_invariants()


# ---- restore ------------------------------------------------------------------------------


def test_a_restore_puts_the_bytes_back_and_frees_the_copy(host: Core) -> None:
    live = host.parked("s")
    expected = host.pool[3:5].copy()
    host.pool[:] = 0
    transitions = host.core.transitions
    with _held(host, live):
        transitions.begin_restore(live)
        assert live.row.state == State.RESUMING
        assert host.core.mover.restore(
            host.tier, live.slots, live.slots, host.core.endpoint(), [7, 8], live.row.checksum
        )
        transitions.finish_restore(
            live, [7, 8], reason=Reason.EXPLICIT, started=0.0, from_state=State.PARKED,
            recomputed=False,
        )  # fmt: skip
    assert live.row.state == State.ACTIVE and live.block_table == [7, 8]
    assert np.array_equal(host.pool[7:9], expected) and host.tier.used_blocks == 0
    assert host.figures()[1] == 0 and host.kinds("s")[-1] == "resume"
    host.core.check_invariants()


def test_a_restore_the_database_refuses_leaves_the_session_parked(host: Core) -> None:
    live = host.parked("s")
    slots, before = list(live.slots), host.figures()
    with _held(host, live):
        host.core.transitions.begin_restore(live)
        with host.refusal.writes_refused(), pytest.raises(StorageUnavailableError):
            host.core.transitions.finish_restore(
                live, [7, 8], reason=Reason.EXPLICIT, started=0.0, from_state=State.PARKED,
                recomputed=False,
            )  # fmt: skip
    assert live.row.state == State.PARKED and live.slots == slots and live.block_table == []
    assert host.tier.used_blocks == 2 and host.figures() == before
    host.core.check_invariants()


def test_an_aborted_restore_is_parked_again_with_a_restore_failed_event(host: Core) -> None:
    live = host.parked("s")
    with _held(host, live):
        host.core.transitions.begin_restore(live)
        host.core.transitions.abort_restore(live, [7, 8], OSError("read failed"), "dram")
    assert live.row.state == State.PARKED and host.tier.used_blocks == 2
    assert host.kinds("s")[-1] == EventKind.RESTORE_FAILED
    host.core.check_invariants()


def test_only_a_parked_or_lost_session_begins_a_restore(host: Core) -> None:
    live = host.active("s")
    with _held(host, live), pytest.raises(InvalidStateError):
        host.core.transitions.begin_restore(live)
    assert live.row.state == State.ACTIVE


# ---- lose, tool return, turn, delete ------------------------------------------------------


def test_a_lost_copy_says_its_reason_and_frees_its_slots(host: Core) -> None:
    live = host.parked("s")
    with _held(host, live):
        host.core.transitions.lose(live, Reason.TTL, "untouched")
    row = live.row
    assert (row.state, row.tier, row.lost_reason) == (State.LOST, None, "untouched")
    lost = host.store.events(T, "s", 1)[0]
    assert (lost.kind, lost.reason, lost.from_tier) == ("lost", "ttl", "dram")
    assert host.tier.used_blocks == 0 and host.figures()[1] == 0
    host.core.check_invariants()


def test_a_loss_the_database_refuses_keeps_the_parked_copy(host: Core) -> None:
    live = host.parked("s")
    before = host.figures()
    refused = pytest.raises(StorageUnavailableError)
    with _held(host, live), host.refusal.writes_refused(), refused:
        host.core.transitions.lose(live, Reason.TTL, "untouched")
    assert live.row.state == State.PARKED and host.tier.used_blocks == 2
    assert host.figures() == before
    host.core.check_invariants()


def test_a_tool_return_records_how_long_the_tool_took(host: Core) -> None:
    live = host.active("s")
    with _held(host, live):
        host.core.transitions.keep(live, "search", 30.0, "short")
        host.core.transitions.tool_return(live)
    back = host.store.events(T, "s", 1)[0]
    assert back.kind == "tool_return" and back.detail == "search" and back.duration_ms
    assert live.row.tool is None and live.row.expected_resume_at is None


def test_a_turn_over_a_parked_copy_drops_the_stale_copy(host: Core) -> None:
    live = host.parked("s")
    with _held(host, live):
        pending = host.core.transitions.turn(live, list(range(12)), [1, 2, 5])
    assert pending == []  # written at once: the freed slots must not stay claimed
    assert live.row.state == State.ACTIVE and live.row.kv_blocks == 3
    assert host.tier.used_blocks == 0 and host.kinds("s")[-1] == "turn"
    host.core.check_invariants()


def test_a_delete_frees_everything_after_its_write(host: Core) -> None:
    live = host.parked("s")
    host.core.delete(T, "s")
    assert live.row.state == State.DELETED and host.tier.used_blocks == 0
    assert State.DELETED not in {k for k, v in host.figures()[0].items() if v}
    host.core.check_invariants()


def test_a_delete_the_database_refuses_changes_nothing(host: Core) -> None:
    live = host.parked("s")
    before = host.figures()
    with host.refusal.writes_refused(), pytest.raises(StorageUnavailableError):
        host.core.delete(T, "s")
    assert live.row.state == State.PARKED and host.tier.used_blocks == 2
    assert host.figures() == before and host.core.live(T, "s") is live


# ---- one way through ----------------------------------------------------------------------


def _assigns_state(tree: ast.AST) -> list[int]:
    """Lines assigning ``<x>.state`` (plain, augmented, or in a tuple of targets)."""
    lines = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            elements = target.elts if isinstance(target, ast.Tuple) else [target]
            for el in elements:
                if isinstance(el, ast.Attribute) and el.attr == "state":
                    lines.append(node.lineno)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == "state"
        ):
            lines.append(node.lineno)
    return lines


def test_no_module_but_the_transitions_assigns_a_session_state() -> None:
    root = Path(agentpark.__file__).parent
    allowed = root / "parking" / "transitions"
    offenders = []
    for path in sorted(root.rglob("*.py")):
        if allowed in path.parents:
            continue
        for line in _assigns_state(ast.parse(path.read_text())):
            source = path.read_text().splitlines()[line - 1]
            if "app.state" in source:  # FastAPI's application state, not a session's
                continue
            offenders.append(f"{path.relative_to(root)}:{line}: {source.strip()}")
    assert offenders == []


def test_the_state_check_finds_an_assignment() -> None:
    assert _assigns_state(ast.parse("row.state = 'active'")) == [1]
    assert _assigns_state(ast.parse("row.state, row.tier = a, b")) == [1]
    assert _assigns_state(ast.parse("setattr(row, 'state', 'x')")) == [1]
    assert _assigns_state(ast.parse("state = 1\nrow.tier = 2")) == []
