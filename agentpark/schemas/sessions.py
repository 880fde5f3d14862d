"""Request and response bodies of the REST API (v1): sessions, events, drain.

These are wire models only: they import nothing from the store or the session core.
``SessionOut.of`` and ``EventOut.of`` read any object with the attributes named by
:class:`SessionRecord` and :class:`EventRecord` (the store's rows are such objects).
"""

from __future__ import annotations

import base64
import math
import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Protocol, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from agentpark.enums import Decision, EventKind, Reason, RestoredFrom, State, Tier, TierChoice

__all__ = [
    "DrainResponse",
    "EventOut",
    "EventPage",
    "EventRecord",
    "GenerateRequest",
    "GenerateResponse",
    "MoveRequest",
    "MoveResponse",
    "PauseRequest",
    "PauseResponse",
    "ResumeResponse",
    "SessionCreate",
    "SessionOut",
    "SessionPage",
    "SessionRecord",
]


# The longest pause a caller may announce: 30 days. Beyond it the deadline means nothing
# to the policy, and a far one (1e12 s) does not fit a datetime.
MAX_EXPECTED_RESUME_S = 30 * 24 * 3600.0


def _surrogate_at(value: Any, where: str = "body") -> str | None:
    """Where in ``value`` a string holds a lone surrogate (not Unicode text), if anywhere."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _surrogate_at(key, f"{where} (a key)") or _surrogate_at(item, f"{where}.{key}")
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _surrogate_at(item, f"{where}[{i}]")
            if found:
                return found
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _repaired(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (and keys) replaced by U+FFFD."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_repaired(k): _repaired(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_repaired(v) for v in value]
    return value


def _json_integer(value: Any) -> Any:
    """JSON Schema's integer: a number with no fraction (``2.0`` too), never text or a bool
    (pydantic's lax int takes ``"2"`` and ``true``; its strict one refuses ``2.0``)."""
    if isinstance(value, str | bool):
        raise ValueError("must be an integer (a JSON number), not text or a boolean")
    return value


JsonInt = Annotated[int, BeforeValidator(_json_integer)]


class _Request(BaseModel):
    # Numbers and booleans are strict fields (the spec's types: "1" is not an integer, 0
    # not a boolean); enums stay lax, FastAPI validating the parsed JSON as Python.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _unicode_only(cls, data: Any) -> Any:
        # A lone surrogate (JSON "\ud800") decodes into a str that cannot be encoded
        # back: refused here, before anything is stored, wherever it is in the body.
        where = _surrogate_at(data)
        if where is not None:
            raise ValueError(f"{where} is not valid Unicode text (a lone surrogate)")
        return data


class SessionCreate(_Request):
    session_id: str | None = Field(
        None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"
    )
    metadata: dict[str, Any] | None = None


class GenerateRequest(_Request):
    # The spec says what the validator below does: not both prompts in one body.
    model_config = ConfigDict(json_schema_extra={"not": {"required": ["prompt", "prompt_tokens"]}})

    prompt: str | None = Field(None, description="text, encoded by the engine's tokenizer")
    prompt_tokens: list[JsonInt] | None = Field(None, description="token ids, instead of prompt")
    max_new_tokens: JsonInt = Field(
        16, ge=1, description="upper bound set by limits.max_new_tokens"
    )
    temperature: float = Field(0.0, ge=0.0, le=100.0, strict=True, description="0 is greedy")
    # 2**53: the largest integer every JSON client (a float64) carries exactly.
    seed: JsonInt = Field(0, ge=0, le=2**53)
    return_logits: bool = Field(
        False,
        strict=True,
        description="include the float32 logits of the next token (base64, little-endian)",
    )

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateRequest:
        if self.prompt is not None and self.prompt_tokens is not None:
            raise ValueError("give prompt or prompt_tokens, not both")
        return self


class PauseRequest(_Request):
    tool: str | None = Field(None, max_length=128, description="the tool the agent is running")
    expected_resume_s: float | None = Field(
        None,
        ge=0.0,
        le=MAX_EXPECTED_RESUME_S,
        allow_inf_nan=False,
        strict=True,
        description="seconds until the agent is expected back: finite, 0..2592000 (30 days)",
    )
    tier: TierChoice = Field(TierChoice.AUTO, description="auto: the fastest tier with room")
    force: bool = Field(False, strict=True, description="park even when the policy would keep it")


_MIN_TS = datetime.min.replace(tzinfo=UTC)
_MAX_TS = datetime.max.replace(tzinfo=UTC)


def _ts(value: float | None) -> datetime | None:
    """An optional stored time; one no datetime can hold (NaN, inf, past year 9999, written
    by a version that did not bound expected_resume_s) reads as null: repaired on read."""
    if value is None or not math.isfinite(value):
        return None
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _ts_required(value: float) -> datetime:
    """A required stored time; out of range it is clamped (to year 1 or 9999, NaN to the
    epoch) rather than raise: repaired on read, so such a row cannot answer 500."""
    found = _ts(value)
    if found is not None:
        return found
    if math.isnan(value):
        return datetime.fromtimestamp(0, UTC)
    return _MIN_TS if value < 0 else _MAX_TS


_E = TypeVar("_E", bound=StrEnum)


def _opt(enum: type[_E], value: str | None) -> _E | None:
    return None if value is None else enum(value)


class SessionRecord(Protocol):
    """What ``SessionOut.of`` reads: a session as the core keeps it (times in epoch s)."""

    @property
    def session_id(self) -> str: ...
    @property
    def tenant(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def tier(self) -> str | None: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def kv_blocks(self) -> int: ...
    @property
    def kv_bytes(self) -> int: ...
    @property
    def created_at(self) -> float: ...
    @property
    def last_active_at(self) -> float: ...
    @property
    def paused_at(self) -> float | None: ...
    @property
    def pause_count(self) -> int: ...
    @property
    def tool(self) -> str | None: ...
    @property
    def expected_resume_at(self) -> float | None: ...
    @property
    def lost_reason(self) -> str | None: ...
    @property
    def meta(self) -> dict[str, Any] | None: ...


class EventRecord(Protocol):
    """What ``EventOut.of`` reads: one recorded transition (``at`` in epoch seconds)."""

    @property
    def id(self) -> int: ...
    @property
    def session_id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def at(self) -> float: ...
    @property
    def duration_ms(self) -> float | None: ...
    @property
    def bytes(self) -> int | None: ...
    @property
    def from_state(self) -> str | None: ...
    @property
    def to_state(self) -> str | None: ...
    @property
    def from_tier(self) -> str | None: ...
    @property
    def to_tier(self) -> str | None: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def detail(self) -> str | None: ...
    @property
    def request_id(self) -> str | None: ...


class SessionOut(BaseModel):
    session_id: str
    tenant: str
    state: State
    tier: Tier | None = Field(description="the tier holding the parked copy; null in the pool")
    num_tokens: int
    kv_blocks: int
    kv_bytes: int
    created_at: datetime
    last_active_at: datetime
    paused_at: datetime | None
    pause_count: int
    tool: str | None
    expected_resume_at: datetime | None
    lost_reason: str | None = Field(description="why a lost session's parked copy is gone")
    metadata: dict[str, Any] = Field(description="what the caller gave at create, as given")

    @classmethod
    def of(cls, row: SessionRecord) -> SessionOut:
        return cls(
            session_id=row.session_id,
            tenant=row.tenant,
            state=State(row.state),
            tier=_opt(Tier, row.tier),
            num_tokens=row.num_tokens,
            kv_blocks=row.kv_blocks,
            kv_bytes=row.kv_bytes,
            created_at=_ts_required(row.created_at),
            last_active_at=_ts_required(row.last_active_at),
            paused_at=_ts(row.paused_at),
            pause_count=row.pause_count,
            # Text stored before lone surrogates were refused: U+FFFD in their place.
            tool=_repaired(row.tool),
            expected_resume_at=_ts(row.expected_resume_at),
            lost_reason=row.lost_reason,
            metadata=_repaired(row.meta or {}),
        )


class SessionPage(BaseModel):
    sessions: list[SessionOut]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page")


class GenerateResponse(BaseModel):
    session_id: str
    tokens: list[int]
    text: str
    num_tokens: int = Field(description="tokens in the session after this call")
    resumed: bool = Field(description="the session was parked or lost and was brought back")
    restored_from: RestoredFrom | None = Field(
        description="where the KV came back from, if resumed"
    )
    resume_ms: float | None
    logits: str | None = Field(None, description="with return_logits: base64 float32 LE")

    @staticmethod
    def encode_logits(logits: Any) -> str:
        return base64.b64encode(logits.astype("<f4").tobytes()).decode()


class MoveRequest(_Request):
    tier: Tier


class PauseResponse(BaseModel):
    session_id: str
    decision: Decision = Field(
        description="kept: the pause is shorter than the round trip would cost (break-even)"
    )
    why: str
    expected_pause_s: float | None = Field(
        description="the estimate the decision used: the caller's, the tool's learned or prior"
    )
    state: State = Field(description="parked; pausing while a wait=false copy is in flight")
    tier: Tier | None
    kv_bytes: int
    pause_ms: float | None = Field(description="null while in flight (wait=false)")


class ResumeResponse(BaseModel):
    session_id: str
    state: State = Field(description="active; resuming/recomputing while in flight")
    restored_from: RestoredFrom = Field(
        description="pool (was active), dram, shm, disk, or recompute"
    )
    resume_ms: float | None = Field(description="null while in flight (wait=false)")


class MoveResponse(BaseModel):
    session_id: str
    state: State
    from_tier: Tier
    tier: Tier | None
    kv_bytes: int
    move_ms: float


class DrainResponse(BaseModel):
    parked: int = Field(description="active sessions parked into shm/disk")
    moved: int = Field(description="dram-parked sessions moved into shm/disk")
    already_safe: int
    lost: int = Field(description="recorded as needing recompute (deadline or no room)")


class EventOut(BaseModel):
    id: int
    session_id: str
    kind: EventKind
    at: datetime
    duration_ms: float | None
    bytes: int | None = Field(description="bytes copied or freed by the transition")
    from_state: State | None
    to_state: State | None
    from_tier: Tier | None
    to_tier: Tier | None
    reason: Reason | None
    detail: str | None
    request_id: str | None = Field(None, description="the engine's request it served")

    @classmethod
    def of(cls, row: EventRecord) -> EventOut:
        return cls(
            id=row.id,
            session_id=row.session_id,
            kind=EventKind(row.kind),
            at=_ts_required(row.at),
            duration_ms=row.duration_ms,
            bytes=row.bytes,
            from_state=_opt(State, row.from_state),
            to_state=_opt(State, row.to_state),
            from_tier=_opt(Tier, row.from_tier),
            to_tier=_opt(Tier, row.to_tier),
            reason=_opt(Reason, row.reason),
            detail=row.detail,
            request_id=row.request_id,
        )


class EventPage(BaseModel):
    events: list[EventOut]
