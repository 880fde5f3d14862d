"""/v1/sessions: the life cycle an orchestrator drives."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Response, status
from starlette.concurrency import run_in_threadpool

from agentpark.api.deps import AUTH_ERRORS, ReadySessionsCaller, SessionsCaller
from agentpark.api.errors_wire import error_responses
from agentpark.enums import State
from agentpark.errors import (
    ContextFullError,
    InvalidRequestError,
    InvalidStateError,
    LimitExceededError,
    NotReadyError,
    PayloadTooLargeError,
    PoolFullError,
    SessionBusyError,
    SessionExistsError,
    SessionNotFoundError,
    StorageUnavailableError,
    TierFullError,
    TransferError,
)
from agentpark.parking import PauseOrder, PauseResult, ResumeResult
from agentpark.schemas.sessions import (
    GenerateRequest,
    GenerateResponse,
    MoveRequest,
    MoveResponse,
    PauseRequest,
    PauseResponse,
    ResumeResponse,
    SessionCreate,
    SessionOut,
    SessionPage,
)

__all__ = ["router"]

# Every route takes a SessionsCaller (or its Ready form): the sessions scope, checked
# first, and the tenant (tests/api/test_auth.py holds every route here to it).
router = APIRouter(
    prefix="/v1/sessions",
    tags=["sessions"],
    responses=error_responses(*AUTH_ERRORS),
)

# What every route on one session can answer: an unknown id (or another tenant's), a bad body.
_ONE_SESSION = (SessionNotFoundError, InvalidRequestError)
# What an operation that takes the session can answer besides (it writes the database).
_OPERATION = (SessionBusyError, InvalidStateError, StorageUnavailableError)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses=error_responses(
        SessionExistsError,
        InvalidRequestError,
        NotReadyError,
        PayloadTooLargeError,
        StorageUnavailableError,
    ),
)
def create_session(
    caller: SessionsCaller,
    body: Annotated[SessionCreate | None, Body()] = None,
) -> SessionOut:
    """Create an empty, active session; an id is generated when none is given."""
    body = body or SessionCreate()
    if body.metadata is not None:
        _check_metadata_size(body.metadata, caller.runtime.settings.limits.max_metadata_bytes)
    return SessionOut.of(caller.parking.create(caller.tenant, body.session_id, body.metadata))


def _check_metadata_size(metadata: dict[str, Any], limit: int) -> None:
    """413 when the metadata, as stored (compact JSON, UTF-8), is over ``limit`` bytes."""
    size = len(json.dumps(metadata, separators=(",", ":"), ensure_ascii=False).encode())
    if size > limit:
        raise PayloadTooLargeError(
            f"metadata is {size} bytes; limits.max_metadata_bytes is {limit}",
            max_metadata_bytes=limit,
            metadata_bytes=size,
        )


@router.get("", responses=error_responses(InvalidRequestError))
def list_sessions(
    caller: SessionsCaller,
    state: State | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[
        str | None,
        Query(description="next_cursor of the previous page", pattern=r"^[0-9]{1,18}$"),
    ] = None,
) -> SessionPage:
    """The tenant's sessions, oldest first, a page at a time."""
    rows = caller.parking.page(caller.tenant, state, limit, _after(cursor))
    next_cursor = str(rows[-1].seq) if len(rows) == limit else None
    return SessionPage(sessions=[SessionOut.of(r) for r in rows], next_cursor=next_cursor)


_MAX_CURSOR = 2**63 - 1  # a sequence number is a SQLite INTEGER


def _after(cursor: str | None) -> int:
    """The sequence number a cursor (a previous page's next_cursor) stands for."""
    if cursor is None:
        return 0
    # ASCII digits only ("²".isdigit() is true) and at most 19 of them before int().
    if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 19):
        raise InvalidRequestError("cursor is not one this API returned", cursor=cursor[:64])
    value = int(cursor)
    if value > _MAX_CURSOR:
        raise InvalidRequestError("cursor is not one this API returned", cursor=cursor)
    return value


@router.get("/{session_id}", responses=error_responses(*_ONE_SESSION))
async def get_session(caller: SessionsCaller, session_id: str) -> SessionOut:
    """One session of the tenant; a deleted one is 404 (its history: ``GET /v1/events``).

    A deleted session is gone as a resource, as REST clients (and spec fuzzers) expect
    after a DELETE; its row stays history, listed by ``GET /v1/sessions?state=deleted``.

    ``async``: a live session's row is a dict lookup, answered on the event loop without
    the thread-pool hop (a third of a millisecond here) a sync route pays. A deleted or
    unknown one is a database read, which could wait for a pooled connection: that one
    goes to the thread pool.
    """
    row = caller.parking.live_row(caller.tenant, session_id)
    if row is None:
        row = await run_in_threadpool(caller.parking.get, caller.tenant, session_id)
    if row.state == State.DELETED:
        raise SessionNotFoundError(session_id, deleted_at=row.deleted_at or 0.0)
    return SessionOut.of(row)


@router.delete(
    "/{session_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=error_responses(*_ONE_SESSION, *_OPERATION),
)
def delete_session(caller: SessionsCaller, session_id: str) -> Response:
    """Free everything the session holds; deleting a deleted session is a no-op."""
    caller.parking.delete(caller.tenant, session_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/{session_id}/generate",
    responses=error_responses(
        *_ONE_SESSION,
        *_OPERATION,
        ContextFullError,
        LimitExceededError,
        NotReadyError,
        PayloadTooLargeError,
        PoolFullError,
        TransferError,
    ),
)
def generate_tokens(
    caller: ReadySessionsCaller, session_id: str, body: GenerateRequest
) -> GenerateResponse:
    """Append the prompt and decode; a parked or lost session is brought back first."""
    driver = caller.driver
    prompt = _prompt(driver.tokenize, body)
    result = driver.generate(
        caller.tenant, session_id, prompt, body.max_new_tokens, body.temperature, body.seed
    )
    return GenerateResponse(
        session_id=session_id,
        tokens=result.tokens,
        text=result.text,
        num_tokens=result.row.num_tokens,
        resumed=result.resumed,
        restored_from=result.restored_from,
        resume_ms=result.resume_ms,
        logits=GenerateResponse.encode_logits(result.next_logits) if body.return_logits else None,
    )


def _prompt(tokenize: Callable[[str], list[int]], body: GenerateRequest) -> list[int]:
    """The prompt's token ids: the text through the engine's tokenizer, or as given."""
    if body.prompt is not None:
        return tokenize(body.prompt)
    return body.prompt_tokens or []


WaitQuery = Annotated[
    bool,
    Query(description="false: answer 202 as soon as the copy has started; GET shows the end"),
]


@router.post(
    "/{session_id}/pause",
    responses={
        202: {"model": PauseResponse, "description": "wait=false: the copy is in flight"},
        **error_responses(
            *_ONE_SESSION,
            *_OPERATION,
            NotReadyError,
            PayloadTooLargeError,
            TierFullError,
            TransferError,
        ),
    },
)
async def pause_session(
    caller: ReadySessionsCaller,
    session_id: str,
    response: Response,
    body: Annotated[PauseRequest | None, Body()] = None,
    wait: WaitQuery = True,
) -> PauseResponse:
    """The agent called a tool: park its KV, unless the pause is too short to be worth it."""
    body = body or PauseRequest()
    order = PauseOrder(body.tier.value, body.tool, body.expected_resume_s, body.force)
    parking, tenant = caller.parking, caller.tenant
    # A small pause that nothing makes wait runs here (no thread hand-off); else a worker,
    # which also reads the answer (a wait=false copy goes on and changes the row).
    now = parking.pause_now(tenant, session_id, order) if wait else None
    if now is not None:
        answer = _paused(now, session_id)
    else:
        answer = await run_in_threadpool(
            lambda: _paused(parking.pause(tenant, session_id, order, wait=wait), session_id)
        )
    if answer.pause_ms is None:
        response.status_code = status.HTTP_202_ACCEPTED
    return answer


def _paused(result: PauseResult, session_id: str) -> PauseResponse:
    row = result.row
    return PauseResponse(
        session_id=session_id,
        decision=result.decision,
        why=result.why,
        expected_pause_s=result.expected_s,
        state=row.state,
        tier=row.tier,
        kv_bytes=row.kv_bytes,
        pause_ms=result.pause_ms,
    )


@router.post(
    "/{session_id}/resume",
    responses={
        202: {"model": ResumeResponse, "description": "wait=false: the copy is in flight"},
        **error_responses(*_ONE_SESSION, *_OPERATION, NotReadyError, PoolFullError, TransferError),
    },
)
async def resume_session(
    caller: ReadySessionsCaller,
    session_id: str,
    response: Response,
    wait: WaitQuery = True,
) -> ResumeResponse:
    """Bring the session's KV back into the pool: copied back, or recomputed if gone."""
    parking, tenant = caller.parking, caller.tenant
    # As pause_session: here when nothing makes it wait, else a worker reads the answer.
    now = parking.resume_now(tenant, session_id) if wait else None
    if now is not None:
        answer = _resumed(now, session_id)
    else:
        answer = await run_in_threadpool(
            lambda: _resumed(parking.resume(tenant, session_id, wait=wait), session_id)
        )
    if answer.resume_ms is None:
        response.status_code = status.HTTP_202_ACCEPTED
    return answer


def _resumed(result: ResumeResult, session_id: str) -> ResumeResponse:
    return ResumeResponse(
        session_id=session_id,
        state=result.row.state,
        restored_from=result.restored_from,
        resume_ms=result.resume_ms,
    )


@router.post(
    "/{session_id}/move",
    responses=error_responses(
        *_ONE_SESSION,
        *_OPERATION,
        NotReadyError,
        PayloadTooLargeError,
        TierFullError,
        TransferError,
    ),
)
def move_session(caller: ReadySessionsCaller, session_id: str, body: MoveRequest) -> MoveResponse:
    """Move a parked session's copy to another tier; it stays parked."""
    result = caller.parking.move(caller.tenant, session_id, body.tier.value)
    return MoveResponse(
        session_id=session_id,
        state=result.row.state,
        from_tier=result.from_tier,
        tier=result.row.tier,
        kv_bytes=result.row.kv_bytes,
        move_ms=result.move_ms,
    )
