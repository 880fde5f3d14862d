"""Every op of the control protocol from one table, as the REST route walk of the auth tests.

For each op in agentpark.control.ops.OPS (a new op without a row here fails the walk):
its frame before ``hello`` is refused (``unauthenticated``), a frame naming a ``tenant``
or an unknown field is refused, each field set wrong in each way (type, NaN, inf, huge,
lone surrogate, too long, empty, missing) is refused as ``bad_request``, and each refusal
leaves the daemon exactly as it was: SQLite rows, live sessions, plans, pool, counts.
Then the valid frame is answered ``ok``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from agentpark.connectors.protocol import encode_tokens
from agentpark.control.ops import MAX_BLOCKS, OPS
from tests.connectors.conftest import ControlDaemon
from tests.control.harness import Raw, state
from tests.control.test_control import BLOCK, LAYOUT, Worker, _register

NAN, INF = float("nan"), float("inf")
MISSING = object()
PARKED = list(range(1, 3 * BLOCK + 1))  # session "p": three whole blocks, parked

INT = ["1", 1.5, NAN, INF, -INF, 1e300, 10**30, -1, True, None, [], {}]
SOME_INT = [v for v in INT if v is not None]  # an optional int: None is valid
PLAN_ID = [*INT, 0, 2**60, MISSING]
FLOAT = ["60", NAN, INF, -INF, 1e300, -1.0, 86_401, True, [], {}]
SESSION = ["", "x" * 129, "t\ud800", "bad id!", 5, [], True]  # absent or null: unnamed
SALT = ["", "x" * 257, "s\ud800", 5, [], True]
LORA = [
    {"name": "a"},
    {"name": "", "path": "/p"},
    {"name": "a", "path": "x" * 4097},
    {"name": "a\ud800", "path": "/p"},
    {"name": "a", "path": "/p", "zzz": 1},
    "lora",
    5,
]
KEYED = {("session_id",): SESSION, ("cache_salt",): SALT, ("lora",): LORA}
TOOL = ["", "x" * 129, "t\ud800", "bad tool!", 5, []]
REQUEST_ID = ["", "x" * 257, "r\ud800", "r\x00", "r\n", "r\x7f", "r\x85", 5, []]
BOOL = ["false", "true", 0, 1, 1.0, None, [], MISSING]
DIGESTS = [["", "x"], ["x" * 200], ["xxh3b:\ud800"], ["nocolon"], [5], "xxh3b:00", 5, [[]]]
DETAIL = ["x" * 5000, "d\ud800", 5, []]
CAUSE = ["", "x" * 100, "c\ud800", "Bad Cause", 5, []]
BLOCKS = [[v] for v in INT if v is not None] + ["1", 5, None, [0] * (MAX_BLOCKS + 1)]
COUNTS = [
    {"\ud800": 1},
    {"timeout": "1"},
    {"timeout": 0},
    {"timeout": 1e300},
    {"timeout": NAN},
    {"timeout": True},
    {f"c{i}": 1 for i in range(65)},
    {"x" * 65: 1},
    [],
    "timeout",
    None,
    MISSING,
]
ARRAYS = [
    [],
    "x",
    [[[2, BLOCK, 8]]],
    [[[2, BLOCK, 8], "uint16\ud800"]],
    [[[0, BLOCK, 8], "uint16"]],
    [[["2", BLOCK, 8], "uint16"]],
    [[[NAN], "uint16"]],
    [[[2, BLOCK, 8], "uint16"]] * 4097,
]
HELD = [
    {"backend": "tpu_sync", "instance": "i\ud800", "capacity_blocks": 4},
    {"backend": "tpu_sync", "instance": "i", "capacity_blocks": INF},
    {"backend": "tpu_sync", "instance": "i", "capacity_blocks": "4"},
    {"backend": "nvme", "instance": "i", "capacity_blocks": 4},
    "held",
    5,
]


@dataclass
class Ctx:
    daemon: ControlDaemon
    conn: Raw
    worker: Worker
    load_id: int = 0
    store: dict[str, Any] | None = None


@dataclass(frozen=True)
class Row:
    """One op: its valid frame (and blob) and each field's wrong values."""

    valid: Callable[[Ctx], tuple[dict[str, Any], bytes]]
    bad: dict[tuple[str, ...], list[Any]]
    setup: Callable[[Ctx], None] = lambda ctx: None


def _start_load(ctx: Ctx) -> None:
    blob = encode_tokens([*PARKED, 1])
    frame = {"op": "begin_load", "session_id": "p", "start_block": 0, "block_ids": [1, 2, 3]}
    answer = ctx.conn.send(frame, blob)
    assert answer["ok"], answer
    ctx.load_id = answer["load_id"]


def _start_store(ctx: Ctx) -> None:
    frame = {"op": "prepare_store", "session_id": "q", "block_ids": [4], "tool": "search"}
    answer = ctx.conn.send({**frame, "expected_resume_s": 60.0}, encode_tokens(range(BLOCK)))
    assert answer["ok"] and answer["decision"] == "parked", answer
    ctx.worker.write(answer["slots"], seed=3)
    ctx.store = answer


def _start_pin(ctx: Ctx) -> None:
    frame = {"op": "prepare_store", "session_id": "w", "block_ids": [6], "tool": "grep"}
    pool = {"engine_total_blocks": 64, "engine_free_blocks": 32, "expected_resume_s": 0.5}
    answer = ctx.conn.send({**frame, **pool}, encode_tokens(range(BLOCK)))
    assert answer["ok"] and answer["decision"] == "pinned", answer
    assert answer["session_id"] == "w" and answer["pin_ttl_s"] == 1.0, answer


def _complete(ctx: Ctx) -> tuple[dict[str, Any], bytes]:
    assert ctx.store is not None
    digests = ctx.worker.digests(ctx.store["slots"])
    return {
        "op": "complete_store",
        "store_id": ctx.store["store_id"],
        "ok": True,
        "digests": digests,
    }, b""


LAYOUT_BAD: dict[tuple[str, ...], list[Any]] = {
    ("layout", "model_uid"): ["", "m\ud800", "x" * 513, 5, MISSING],
    ("layout", "block_size"): [*INT, 0, MISSING],
    ("layout", "num_blocks"): [*INT, 0, MISSING],
    ("layout", "arrays"): [*ARRAYS, MISSING],
    ("layout", "kv_dtype"): ["", "k\ud800", "x" * 65, 5, MISSING],
    ("layout",): ["layout", 5, None, MISSING],
    ("held",): HELD,
}

TABLE: dict[str, Row] = {
    "hello": Row(
        lambda ctx: ({"op": "hello"}, b""),
        {
            ("token",): [5, "", "t\ud800", "x" * 300, []],
            ("peer",): ["", "p\ud800", "bad peer!", 5, "x" * 200],
        },
    ),
    "register": Row(lambda ctx: ({"op": "register", "layout": LAYOUT.to_wire()}, b""), LAYOUT_BAD),
    "match": Row(
        lambda ctx: (
            {"op": "match", "session_id": "p", "num_computed": 0},
            encode_tokens([*PARKED, 1]),
        ),
        {**KEYED, ("num_computed",): [*INT, MISSING], ("request_id",): REQUEST_ID},
    ),
    "begin_load": Row(
        lambda ctx: (
            {"op": "begin_load", "session_id": "p", "start_block": 0, "block_ids": [1, 2, 3]},
            encode_tokens([*PARKED, 1]),
        ),
        {
            **KEYED,
            ("start_block",): [*INT, MISSING],
            ("block_ids",): [*BLOCKS, [], MISSING],
            ("request_id",): REQUEST_ID,
        },
    ),
    "load_done": Row(
        lambda ctx: ({"op": "load_done", "load_id": ctx.load_id, "ok": True}, b""),
        {("load_id",): PLAN_ID, ("ok",): BOOL, ("cause",): CAUSE},
        _start_load,
    ),
    "prepare_store": Row(
        lambda ctx: (
            {
                "op": "prepare_store",
                "session_id": "v",
                "block_ids": [5],
                "tool": "search",
                "expected_resume_s": 60.0,
                "engine_free_blocks": 32,
                "engine_total_blocks": 64,
                "pinned_blocks": 0,
                "pressure": False,
                "prefill_ms_per_token": 0.5,
            },
            encode_tokens(range(BLOCK)),
        ),
        {
            **KEYED,
            ("block_ids",): [*BLOCKS, [5, 6], MISSING],
            ("tool",): TOOL,
            ("expected_resume_s",): FLOAT,
            ("request_id",): REQUEST_ID,
            ("engine_free_blocks",): [*SOME_INT, 65],  # more than engine_total_blocks
            ("engine_total_blocks",): [*SOME_INT, 0],
            ("pinned_blocks",): [*INT, 65],
            ("pressure",): [v for v in BOOL if v is not MISSING],
            ("prefill_ms_per_token",): [*FLOAT[:6], 1e6, True],
        },
    ),
    "complete_store": Row(
        _complete,
        {
            ("store_id",): PLAN_ID,
            ("ok",): BOOL,
            ("digests",): [*DIGESTS, None, MISSING],  # none: the pool is checksummed
            ("detail",): DETAIL,
        },
        _start_store,
    ),
    "degraded": Row(
        lambda ctx: ({"op": "degraded", "counts": {"timeout": 1}}, b""),
        {("counts",): COUNTS},
    ),
    "release": Row(
        lambda ctx: ({"op": "release", "session_id": "p"}, b""),
        {("session_id",): SESSION},
    ),
    "unpin": Row(
        lambda ctx: (
            {"op": "unpin", "session_id": "w", "cause": "return", "blocks": 1, "reused_tokens": 8},
            b"",
        ),
        {
            ("session_id",): [*SESSION, None, MISSING],
            ("cause",): ["", "Return", "expired", "r\ud800", 5, None, [], MISSING],
            ("blocks",): SOME_INT,
            ("reused_tokens",): SOME_INT,
        },
        _start_pin,
    ),
}


def _with(frame: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(frame)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    if value is MISSING:
        parent.pop(path[-1], None)
    else:
        parent[path[-1]] = value
    return out


@pytest.fixture
def ctx(control_daemon: ControlDaemon) -> Any:
    daemon = control_daemon
    _, worker = _register(daemon)
    conn = Raw(daemon.service.socket_path)
    assert conn.hello()["tenant"] == "default"
    made = Ctx(daemon, conn, worker)
    answer = conn.send(
        {"op": "prepare_store", "session_id": "p", "block_ids": [1, 2, 3], "tool": "t"},
        encode_tokens(PARKED),
    )
    assert answer["ok"], answer
    worker.write(answer["slots"], seed=1)
    digests = worker.digests(answer["slots"])
    frame = {"op": "complete_store", "store_id": answer["store_id"], "ok": True}
    assert conn.send({**frame, "digests": digests})["decision"] == "parked"
    yield made
    conn.close()


def test_the_walk_has_a_row_for_every_op_and_no_other() -> None:
    assert set(TABLE) == set(OPS)


@pytest.mark.parametrize("op", sorted(OPS))
def test_every_op_refuses_each_wrong_field_and_changes_nothing(ctx: Ctx, op: str) -> None:
    row = TABLE[op]  # an op added to the protocol without a row here fails
    row.setup(ctx)
    daemon, path = ctx.daemon, ctx.daemon.service.socket_path
    valid, blob = row.valid(ctx)
    before = state(daemon)

    def refused(frame: dict[str, Any], cause: str, *, fresh: bool = False) -> None:
        conn = Raw(path) if fresh else ctx.conn
        try:
            answer = conn.send(frame, blob)
        finally:
            if fresh:
                conn.close()
        assert answer["ok"] is False and answer["cause"] == cause, (frame, answer)
        assert state(daemon) == before, frame

    hello = op == "hello"
    if not hello:
        refused(valid, "unauthenticated", fresh=True)
    refused({**valid, "tenant": "other"}, "bad_request", fresh=hello)
    refused({**valid, "tenant": "default"}, "bad_request", fresh=hello)
    refused({**valid, "zzz": 1}, "bad_request", fresh=hello)
    refused({**valid, "op": "no_such_op"}, "bad_request", fresh=hello)
    for field, values in row.bad.items():
        for value in values:
            refused(_with(valid, field, value), "bad_request", fresh=hello)
    conn = Raw(path) if hello else ctx.conn
    answer = conn.send(valid, blob)
    assert answer["ok"] is True, answer
    if hello:
        conn.close()
