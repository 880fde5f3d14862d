"""The control ops' requests and answers as typed models, validated like the REST schemas.

Pydantic v2, as agentpark.api.schemas: the same rules hold on both doors (strict types,
so ``"false"`` is not a bool and ``1e300`` not an id; finite bounded numbers; no unknown
field; valid Unicode, no lone surrogate anywhere; bounded lengths; ``session_id`` and
``tool`` by the very regexes the connector checks a request's params with), and a
refusal says which field and why without echoing what was sent. A frame is validated
whole before its op touches anything, so a refused frame changes nothing.

``tenant`` is refused in every frame: a connection's tenant is its token's, said once in
``hello`` (agentpark.control.handlers); a frame cannot name another.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from agentpark.connectors.protocol import (
    HELD_BACKENDS,
    INSTANCE_RE,
    SESSION_ID_RE,
    TOOL_RE,
    Held,
    Layout,
    UnpinCause,
)
from agentpark.kvkeys import Lora
from agentpark.parking.external.lookup import RequestKeys

__all__ = [
    "BLOB_OPS",
    "OPS",
    "REQUEST_ID_RE",
    "BadRequest",
    "BeginLoadAnswer",
    "BeginLoadRequest",
    "CompleteStoreAnswer",
    "CompleteStoreRequest",
    "DegradedAnswer",
    "DegradedRequest",
    "HelloAnswer",
    "HelloRequest",
    "LoadDoneAnswer",
    "LoadDoneRequest",
    "MatchAnswer",
    "MatchRequest",
    "PrepareStoreAnswer",
    "PrepareStoreRequest",
    "RegisterAnswer",
    "RegisterRequest",
    "ReleaseAnswer",
    "ReleaseRequest",
    "RequestId",
    "UnpinAnswer",
    "UnpinRequest",
    "parse_request",
]

MAX_BLOCKS = 1 << 17  # block ids in one request: 2M tokens at 16 a block
MAX_EXPECTED_RESUME_S = 86_400.0  # what the connector's kv_transfer_params allow
MAX_PREFILL_MS_PER_TOKEN = 60_000.0  # a minute a token: slower than any engine measured
_PLAN_ID = Annotated[int, Field(ge=1, le=2**53)]
_BLOCK = Annotated[int, Field(ge=0, le=2**31 - 1)]
_COUNT = Annotated[int, Field(ge=0, le=2**31 - 1)]
SessionId = Annotated[str, Field(min_length=1, max_length=128, pattern=SESSION_ID_RE.pattern)]
Tool = Annotated[str, Field(min_length=1, max_length=128, pattern=TOOL_RE.pattern)]
_NAME = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]
_DIGEST = Annotated[
    str, Field(min_length=3, max_length=160, pattern=r"^[a-z0-9]{1,16}:[0-9a-f]{1,128}$")
]
REQUEST_ID_RE = r"^[^\x00-\x1f\x7f-\x9f]{1,256}$"
"""An engine's request id (vLLM's ``request_id``): printable, no control character."""
RequestId = Annotated[str, Field(min_length=1, max_length=256, pattern=REQUEST_ID_RE)]


class BadRequest(Exception):
    """A frame the ops refuse: answered ``bad_request``, nothing changed."""


def _surrogate_in(value: object) -> bool:
    """Whether a lone surrogate is in any string (or key) of ``value`` (iterative)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if any("\ud800" <= ch <= "\udfff" for ch in item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _checked(cls, data: Any) -> Any:
        if isinstance(data, dict) and "tenant" in data:
            raise ValueError(
                "tenant: a connection acts for its token's tenant (said once, in hello); "
                "a frame cannot name one"
            )
        if _surrogate_in(data):
            raise ValueError("a string is not valid Unicode text (a lone surrogate)")
        return data


class HelloRequest(_Request):
    op: Literal["hello"]
    token: str | None = Field(None, min_length=1, max_length=256)
    peer: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=INSTANCE_RE.pattern,
        description="the engine the connector serves (vLLM's engine_id): its scheduler's "
        "and its workers' connections complete each other's plans",
    )


class LayoutIn(_Request):
    model_uid: str = Field(min_length=1, max_length=512)
    block_size: int = Field(ge=1, le=1 << 20)
    num_blocks: int = Field(ge=1, le=2**31 - 1)
    arrays: list[tuple[list[Annotated[int, Field(ge=1, le=2**31 - 1)]], _NAME]] = Field(
        min_length=1, max_length=4096
    )
    kv_dtype: str = Field(min_length=1, max_length=64)

    @field_validator("arrays", mode="before")
    @classmethod
    def _pairs(cls, value: Any) -> Any:
        # JSON has no tuple: each [shape, dtype] array is one (strict mode wants a tuple).
        if isinstance(value, list):
            return [tuple(v) if isinstance(v, list) and len(v) == 2 else v for v in value]
        return value

    def layout(self) -> Layout:
        return Layout.from_wire(self.model_dump())


class HeldIn(_Request):
    backend: str = Field(min_length=1, max_length=32)
    instance: str = Field(min_length=1, max_length=128, pattern=INSTANCE_RE.pattern)
    capacity_blocks: int = Field(ge=1, le=2**31)

    @model_validator(mode="after")
    def _known(self) -> HeldIn:
        if self.backend not in HELD_BACKENDS:
            raise ValueError(f"held.backend must be one of {sorted(HELD_BACKENDS)}")
        return self

    def held(self) -> Held:
        return Held.from_wire(self.model_dump())


class RegisterRequest(_Request):
    op: Literal["register"]
    layout: LayoutIn
    held: HeldIn | None = None


class LoraIn(_Request):
    """A LoRA adapter as vLLM keys blocks with it (its name and path)."""

    name: str = Field(min_length=1, max_length=256)
    path: str = Field(min_length=1, max_length=4096)


class _Keyed(_Request):
    """A request's session (None: it has no name, matched and parked by content only)
    and what keys its blocks besides its tokens (vLLM's cache_salt and LoRA)."""

    session_id: SessionId | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=256)
    lora: LoraIn | None = None

    def extra(self) -> RequestKeys:
        lora = None if self.lora is None else Lora(self.lora.name, self.lora.path)
        return RequestKeys(self.cache_salt, lora)


class MatchRequest(_Keyed):
    op: Literal["match"]
    num_computed: _COUNT
    request_id: RequestId | None = None


class BeginLoadRequest(_Keyed):
    op: Literal["begin_load"]
    start_block: int = Field(ge=0, le=MAX_BLOCKS)
    block_ids: list[_BLOCK] = Field(min_length=1, max_length=MAX_BLOCKS)
    request_id: RequestId | None = None


class LoadDoneRequest(_Request):
    op: Literal["load_done"]
    load_id: _PLAN_ID
    ok: bool
    cause: _NAME | None = None


class PrepareStoreRequest(_Keyed):
    op: Literal["prepare_store"]
    block_ids: list[_BLOCK] = Field(max_length=MAX_BLOCKS)
    tool: Tool | None = None
    expected_resume_s: float | None = Field(None, ge=0.0, le=MAX_EXPECTED_RESUME_S)
    request_id: RequestId | None = None
    # What the connector sees of vLLM's pool at the turn end (protocol 4): the adaptive
    # answer (pin, park, drop) weighs them (agentpark.policy.turn_end).
    engine_free_blocks: _COUNT | None = None
    engine_total_blocks: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = None
    pinned_blocks: _COUNT = 0
    pressure: bool = Field(
        False, description="a pinned turn let go under pressure: parked or dropped, never pinned"
    )
    prefill_ms_per_token: float | None = Field(None, ge=0.0, le=MAX_PREFILL_MS_PER_TOKEN)
    # Protocol 5: the connector copies a pinned turn behind its pin (answered pinned + a store).
    backs_pins: bool = False

    @model_validator(mode="after")
    def _pool(self) -> PrepareStoreRequest:
        total = self.engine_total_blocks
        free = self.engine_free_blocks
        if total is not None and free is not None and free > total:
            raise ValueError("engine_free_blocks: more than engine_total_blocks")
        if total is not None and self.pinned_blocks > total:
            raise ValueError("pinned_blocks: more than engine_total_blocks")
        return self


class CompleteStoreRequest(_Request):
    op: Literal["complete_store"]
    store_id: _PLAN_ID
    ok: bool
    digests: list[_DIGEST] | None = Field(
        None,
        max_length=MAX_BLOCKS,
        description="the digest of each block the plan said to copy, in order",
    )
    detail: str | None = Field(None, max_length=4096)


class ReleaseRequest(_Request):
    """The conversation is over (kv_hints ``agentpark.release``): delete the session."""

    op: Literal["release"]
    session_id: SessionId


class UnpinRequest(_Request):
    """A pin ended on the connector's side: the daemon forgets it and counts why."""

    op: Literal["unpin"]
    session_id: SessionId
    cause: UnpinCause
    blocks: _COUNT = 0
    reused_tokens: _COUNT = Field(
        0, description="on return: the tokens of the next request vLLM's prefix cache served"
    )


class DegradedRequest(_Request):
    op: Literal["degraded"]
    counts: dict[
        Annotated[str, Field(min_length=1, max_length=64)],
        Annotated[int, Field(ge=1, le=1_000_000_000)],
    ] = Field(max_length=64)


class _Answer(BaseModel):
    omit_none: ClassVar[bool] = False  # fields that do not apply are left out, not null

    def wire(self) -> dict[str, Any]:
        return {"ok": True, **self.model_dump(exclude_none=self.omit_none)}


class HelloAnswer(_Answer):
    protocol: int
    version: str
    tenant: str
    pin_share: float  # the most of vLLM's KV cache pins may hold: the connector's bound too


class RegisterAnswer(_Answer):
    omit_none = True
    pool: dict[str, Any] | None = None  # PoolFile.to_wire()
    held: dict[str, Any] | None = None  # pool_id, capacity_blocks, kept, checksum


class MatchAnswer(_Answer):
    tokens: int


class BeginLoadAnswer(_Answer):
    load_id: int
    tier: str
    slots: list[int]
    digests: list[str | None]  # what each slot's block must hash to (None: unchecked)
    pool_id: str | None


class LoadDoneAnswer(_Answer):
    restored_tokens: int
    restored_from: str | None
    why: str


class PrepareStoreAnswer(_Answer):
    omit_none = True
    decision: str
    why: str
    store_id: int | None = None
    slots: list[int] | None = None
    fresh: list[bool] | None = None  # per slot: copy into it (else the pool holds the block)
    checksum: bool | None = None
    pool_id: str | None = None
    pin_ttl_s: float | None = None  # pinned: free the blocks after this at the latest
    expected_resume_s: float | None = None  # pinned: the pressure order (latest first)
    session_id: str | None = None  # pinned: the name unpin gives (an anonymous one's anon-)


class CompleteStoreAnswer(_Answer):
    decision: str
    why: str


class DegradedAnswer(_Answer):
    pass


class UnpinAnswer(_Answer):
    pinned: bool  # False: the daemon had no such pin (ended already, or forgotten)
    why: str


class ReleaseAnswer(_Answer):
    released: bool  # False: the tenant has no such session (or it was deleted already)
    why: str


OPS: dict[str, tuple[type[_Request], type[_Answer]]] = {
    "hello": (HelloRequest, HelloAnswer),
    "register": (RegisterRequest, RegisterAnswer),
    "match": (MatchRequest, MatchAnswer),
    "begin_load": (BeginLoadRequest, BeginLoadAnswer),
    "load_done": (LoadDoneRequest, LoadDoneAnswer),
    "prepare_store": (PrepareStoreRequest, PrepareStoreAnswer),
    "complete_store": (CompleteStoreRequest, CompleteStoreAnswer),
    "degraded": (DegradedRequest, DegradedAnswer),
    "release": (ReleaseRequest, ReleaseAnswer),
    "unpin": (UnpinRequest, UnpinAnswer),
}
"""Every op: its request and answer. A new op is added here, or it is unknown."""

BLOB_OPS = frozenset({"match", "begin_load", "prepare_store"})
"""The ops whose frame carries the request's tokens (int32) as its blob."""


def _why(exc: ValidationError) -> str:
    """The first errors, by field, without the values sent (they may be anything)."""
    parts = []
    for error in exc.errors(include_input=False, include_url=False)[:3]:
        where = ".".join(str(p) for p in error["loc"]) or "frame"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def parse_request(message: dict[str, Any], blob: bytes) -> _Request:
    """The typed request of a frame; BadRequest naming what is wrong."""
    op = message.get("op")
    spec = OPS.get(op) if isinstance(op, str) else None
    if spec is None:
        shown = repr(op)[:40] if not isinstance(op, str) or not _surrogate_in(op) else "?"
        raise BadRequest(f"unknown op {shown}")
    if blob and op not in BLOB_OPS:
        raise BadRequest(f"{op} takes no blob")
    if op in BLOB_OPS and len(blob) % 4:
        raise BadRequest(f"token blob of {len(blob)} bytes is not int32s")
    try:
        return spec[0].model_validate(message)
    except ValidationError as exc:
        raise BadRequest(_why(exc)) from None
    except ValueError as exc:  # Layout / Held's own checks, after the model's
        raise BadRequest(str(exc)[:300]) from None
