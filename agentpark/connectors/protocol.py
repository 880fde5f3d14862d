"""The control protocol between an engine's connector and the daemon: one light module.

Both sides import it (the daemon's control server and the connector inside vLLM), so a
message shape is defined once. Transport: a unix socket in the daemon's state dir (0600),
one persistent connection per connector process, request/answer in lock step.

A frame is ``<u32 json_len><u32 blob_len>`` (little-endian), then a UTF-8 JSON object,
then ``blob_len`` raw bytes. Token ids travel in the blob as little-endian int32 (a 4k
token prompt is 16 KiB copied, not 20 KiB of JSON parsed). A request is
``{"op": NAME, ...}``; an answer is ``{"ok": true, ...}`` or ``{"ok": false, "error":
MESSAGE, "cause": CAUSE}``.

Every connection's first frame is ``hello``; the daemon answers nothing else before it.
Each op's request and answer is a typed model (agentpark.control.ops: fields, types and
bounds); a frame that breaks one is answered ``bad_request`` and changes nothing. A frame
names no tenant: the connection's is its token's.

Operations:

=================  ======================================================================
hello              the first frame of every connection: the connector's token (``token``,
                   absent where the daemon allows its loopback default) and the engine it
                   serves (``peer``); answers the token's tenant, the version and protocol
register           a worker's KV layout -> the host pool file to map (created or re-attached);
                   with ``held`` (:class:`Held`: TPU Sync keeps the bytes in the worker's
                   own host memory) the daemon makes no file and keeps slot bookkeeping only
match              how many tokens beyond ``num_computed`` parked blocks hold (the session's
                   own copy, or any of the tenant's by block key; ``session_id`` optional)
begin_load         take parked blocks for a load: tier slots and each block's digest
load_done          the worker loaded (or found the copy damaged): commit or drop it
prepare_store      a turn ended: park (a slot per block, ``fresh`` where the worker copies;
                   the pool holds the others by content), pin (keep the blocks allocated
                   for ``pin_ttl_s``), drop (free them now) or keep (nothing), and why
complete_store     the worker copied the fresh blocks (with each one's digest), or failed
release            the conversation is over (a kv_hints ``agentpark.release``): delete the
                   session, its parked copy freed
unpin              a pin ended (the session's next request, its time-out, pressure, the
                   engine's shutdown or the daemon's restart), with what it saved
degraded           counts of requests a connector served without agentpark, by cause
=================  ======================================================================
"""

from __future__ import annotations

import json
import re
import socket
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, TypeGuard, get_args

import numpy as np

__all__ = [
    "HELD_BACKENDS",
    "MAX_BLOB",
    "MAX_DEPTH",
    "MAX_JSON",
    "PROTOCOL",
    "TURN_END_DECISIONS",
    "UNPIN_CAUSES",
    "Held",
    "Layout",
    "PoolFile",
    "ProtocolError",
    "SessionParams",
    "UnpinCause",
    "decode_tokens",
    "encode_frame",
    "encode_tokens",
    "parse_body",
    "parse_head",
    "parse_params",
    "read_frame",
    "valid_session_id",
]

PROTOCOL = 5  # 2: hello with the token first; 3: blocks by content; 4: pins (unpin);
# 5: a pin with a parked copy behind it (prepare_store backs_pins, answered pinned + a store)
MAX_JSON = 1 << 20
# A token blob: 16 MiB is 4M token ids, several times the longest context any model takes.
MAX_BLOB = 16 << 20
MAX_DEPTH = 16  # the deepest frame is register's layout (5 levels)
_HEAD = struct.Struct("<II")
HEAD_SIZE = _HEAD.size

SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
TOOL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
PARAM_KEYS = frozenset({"session_id", "tool", "expected_resume_s", "tenant"})
TURN_END_DECISIONS = ("parked", "pinned", "dropped", "kept")
"""prepare_store's answers: copy then free; hold allocated; free now; nothing done."""
UnpinCause = Literal["return", "timeout", "pressure", "shutdown", "restart"]
UNPIN_CAUSES: tuple[str, ...] = get_args(UnpinCause)
"""Why a pin ends (``unpin``): the next request came, its time-out, the pool needed the
blocks, vLLM stopped, or the daemon restarted (it forgot the pin; the connector frees it)."""
HELD_BACKENDS = frozenset({"tpu_sync"})
"""Backends that keep parked bytes in the worker's own host memory (``register`` with held)."""
INSTANCE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class ProtocolError(Exception):
    """A frame that is malformed, too large, or cut short (the connection is dropped)."""


def encode_frame(message: dict[str, Any], blob: bytes = b"") -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return _HEAD.pack(len(body), len(blob)) + body + blob


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ProtocolError("connection closed mid-frame" if got else "connection closed")
        got += k
    return bytes(buf)


def parse_head(head: bytes) -> tuple[int, int]:
    """(json_len, blob_len) of a frame header; ProtocolError when either is over its bound
    (checked before a byte of the body is buffered)."""
    json_len, blob_len = _HEAD.unpack(head)
    if json_len > MAX_JSON or blob_len > MAX_BLOB:
        raise ProtocolError(f"frame too large ({json_len} + {blob_len} bytes)")
    return json_len, blob_len


def _depth_within(value: object, limit: int) -> bool:
    """Whether ``value``'s containers nest at most ``limit`` deep (iterative: no recursion)."""
    stack: list[tuple[dict[str, Any] | list[Any], int]] = []
    if isinstance(value, dict | list):
        stack.append((value, 1))
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return False
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return True


def parse_body(body: bytes) -> dict[str, Any]:
    """A frame's JSON object; ProtocolError for bad JSON, another type, or nesting deeper
    than :data:`MAX_DEPTH` (a 100,000-deep array is refused, never a RecursionError)."""
    try:
        message = json.loads(body)
    except RecursionError:
        raise ProtocolError(f"frame nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise ProtocolError(f"frame is not JSON: {str(exc)[:200]}") from None
    if not isinstance(message, dict):
        raise ProtocolError("frame is not a JSON object")
    if not _depth_within(message, MAX_DEPTH):
        raise ProtocolError(f"frame nests deeper than {MAX_DEPTH} levels")
    return message


def read_frame(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    """One frame from ``sock`` (blocking: the connector's side); ProtocolError on EOF,
    oversize or bad JSON."""
    json_len, blob_len = parse_head(_recv_exact(sock, _HEAD.size))
    body = _recv_exact(sock, json_len)
    blob = _recv_exact(sock, blob_len) if blob_len else b""
    return parse_body(body), blob


def encode_tokens(tokens: Sequence[int]) -> bytes:
    return np.asarray(tokens, dtype="<i4").tobytes()


def decode_tokens(blob: bytes) -> np.ndarray:
    if len(blob) % 4:
        raise ProtocolError(f"token blob of {len(blob)} bytes is not int32s")
    return np.frombuffer(blob, dtype="<i4")


@dataclass(frozen=True)
class Layout:
    """An engine's KV layout as its worker read it from the KV tensors at registration.

    ``arrays``: one entry per copyable array (a layer, or a layer's K or V where the
    engine keeps them apart), each ``(block_shape, dtype)`` with the block axis first;
    ``dtype`` is a numpy name of the same item size (bfloat16 travels as uint16 bits).
    """

    model_uid: str
    block_size: int
    num_blocks: int
    arrays: tuple[tuple[tuple[int, ...], str], ...]
    kv_dtype: str  # the engine's own name of the element type, e.g. "torch.bfloat16"

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> Layout:
        try:
            arrays = tuple(
                (tuple(int(d) for d in shape), str(dtype)) for shape, dtype in raw["arrays"]
            )
            layout = cls(
                str(raw["model_uid"]),
                int(raw["block_size"]),
                int(raw["num_blocks"]),
                arrays,
                str(raw["kv_dtype"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"bad layout: {exc!r}") from None
        if layout.block_size <= 0 or layout.num_blocks <= 0 or not arrays:
            raise ProtocolError("bad layout: block_size, num_blocks and arrays must be positive")
        if not 0 < len(layout.model_uid) <= 512:
            raise ProtocolError("bad layout: model_uid must be 1-512 characters")
        return layout


@dataclass(frozen=True)
class PoolFile:
    """Where the host pool lives and how a worker maps it (the tier file's own layout).

    Array ``i``'s slot ``s`` is ``block_nbytes[i]`` bytes at ``offsets[i] + s *
    block_nbytes[i]``. ``pool_id`` changes whenever the daemon makes a new file, so a
    worker holding a map of an older one maps again.
    """

    path: str
    file_bytes: int
    capacity_blocks: int
    offsets: tuple[int, ...]
    block_nbytes: tuple[int, ...]
    pool_id: str

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> PoolFile:
        return cls(
            str(raw["path"]),
            int(raw["file_bytes"]),
            int(raw["capacity_blocks"]),
            tuple(int(o) for o in raw["offsets"]),
            tuple(int(n) for n in raw["block_nbytes"]),
            str(raw["pool_id"]),
        )


@dataclass(frozen=True)
class Held:
    """Where a worker whose DMA backend keeps the parked bytes itself holds them.

    TPU Sync allocates (and, on a TPU, pins) its host blocks in the worker's process and
    keeps them in the TPU's tiled layout; no one else can read them. The daemon's pool is
    then slot bookkeeping only: slot ``s`` is the backend's host block ``s``, and there are
    ``capacity_blocks`` of them (the worker sized them). ``instance`` names that host
    memory: a new value means the bytes of an earlier one are gone (the worker restarted
    without re-attaching TPU Sync's shm segments), so the daemon drops what it had parked
    there; the same value (a daemon restart, or a worker that re-attached the segments)
    keeps it.
    """

    backend: str
    instance: str
    capacity_blocks: int

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> Held:
        try:
            held = cls(str(raw["backend"]), str(raw["instance"]), int(raw["capacity_blocks"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"bad held: {exc!r}") from None
        if held.backend not in HELD_BACKENDS:
            raise ProtocolError(f"bad held: unknown backend {held.backend[:32]!r}")
        if not INSTANCE_RE.match(held.instance):
            raise ProtocolError("bad held: instance must be 1-128 letters, digits or ._:-")
        if not 0 < held.capacity_blocks <= 1 << 31:
            raise ProtocolError("bad held: capacity_blocks must be in 1..2**31")
        return held


def valid_session_id(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a session id agentpark takes (1-128 letters, digits or ._:-),
    wherever it came from (kv_transfer_params, vLLM's own ``session_id``)."""
    return isinstance(value, str) and SESSION_ID_RE.fullmatch(value) is not None


@dataclass(frozen=True)
class SessionParams:
    """A request's session as the connector serves it, validated.

    ``session_id`` None is an anonymous request (no session named anywhere): the scheduler
    side decides in one place (``SchedulerSide._anonymous``) whether such a request is
    served; :func:`parse_params` never makes one.
    """

    session_id: str | None
    tool: str | None = None
    expected_resume_s: float | None = None


def parse_params(raw: object, tenant: str) -> SessionParams | str | None:
    """``kv_transfer_params`` -> the session's params, None (not an agentpark request), or
    the reason (a str) they are refused. Never raises: a client's bad input must not
    reach vLLM as an exception.
    """
    if not isinstance(raw, dict) or "agentpark" not in raw:
        return None
    ours = raw["agentpark"]
    if not isinstance(ours, dict):
        return f"kv_transfer_params.agentpark must be an object, got {type(ours).__name__}"
    unknown = sorted(str(k)[:32] for k in ours if k not in PARAM_KEYS)
    if unknown:
        return f"kv_transfer_params.agentpark has unknown keys {unknown[:5]}"
    session_id = ours.get("session_id")
    if not valid_session_id(session_id):
        shown = repr(session_id)[:40] if isinstance(session_id, str) else type(session_id).__name__
        return (
            "kv_transfer_params.agentpark.session_id must be 1-128 letters, digits or ._:- "
            f"(got {shown})"
        )
    asked_tenant = ours.get("tenant")
    if asked_tenant is not None and asked_tenant != tenant:
        return (
            "kv_transfer_params.agentpark.tenant names another tenant than this "
            "connector's: a request cannot reach another tenant's sessions"
        )
    tool = ours.get("tool")
    if tool is not None and (not isinstance(tool, str) or not TOOL_RE.match(tool)):
        return "kv_transfer_params.agentpark.tool must be 1-128 letters, digits or ._:/-"
    expected = ours.get("expected_resume_s")
    if expected is not None:
        if isinstance(expected, bool) or not isinstance(expected, int | float):
            return "kv_transfer_params.agentpark.expected_resume_s must be a number of seconds"
        if not 0.0 <= float(expected) <= 86_400.0:
            return "kv_transfer_params.agentpark.expected_resume_s must be in 0..86400"
        expected = float(expected)
    return SessionParams(session_id, tool, expected)
