"""/v1/moves: sessions handed between daemons (agentpark.moving); admin scope on both ends.

The source's routes (``POST /v1/moves``, ``POST /v1/moves/drain``) are what an operator
calls; the target's (``/v1/moves/in...``) are what the source calls with ``to_token``.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status
from starlette.concurrency import run_in_threadpool

from agentpark.api.deps import ADMIN, AUTH_ERRORS
from agentpark.api.errors_wire import error_responses
from agentpark.errors import (
    InvalidRequestError,
    InvalidStateError,
    NotReadyError,
    PayloadTooLargeError,
    SessionBusyError,
    SessionExistsError,
    SessionNotFoundError,
    StorageUnavailableError,
    TierFullError,
)
from agentpark.moving import MoveService
from agentpark.moving.wire import (
    BLOCKS_HEADER,
    BatchBegin,
    BatchBeginAnswer,
    BatchCommit,
    BatchCommitAnswer,
    BeginAnswer,
    ChunkAnswer,
    CommitAnswer,
    DrainToRequest,
    DrainToResult,
    LayoutMismatchError,
    MoveManifest,
    MoveOutRequest,
    MoveOutResult,
    PeerError,
)

__all__ = ["router"]

router = APIRouter(
    prefix="/v1/moves",
    tags=["moves"],
    dependencies=[ADMIN],
    responses=error_responses(*AUTH_ERRORS),
)

_SOURCE_ERRORS = (
    SessionNotFoundError,
    InvalidStateError,
    SessionBusyError,
    LayoutMismatchError,
    TierFullError,
    PeerError,
    StorageUnavailableError,
    InvalidRequestError,
    PayloadTooLargeError,
)


def _moves(request: Request) -> MoveService:
    moves: MoveService = request.app.state.moves
    return moves


@router.post("", responses=error_responses(*_SOURCE_ERRORS))
def move_session(request: Request, body: MoveOutRequest) -> MoveOutResult:
    """Hand one parked session to another daemon (``to``, with an admin token of it).

    The session is gone from here once the target committed it; a target without room
    answers 507 and the session stays here untouched. A dropped connection is picked up
    again by itself; a move that gave up is picked up by asking again.
    """
    return _moves(request).move(body.tenant, body.session_id, body.to, body.to_token)


@router.post("/drain", responses=error_responses(*_SOURCE_ERRORS))
def drain_to(request: Request, body: DrainToRequest) -> DrainToResult:
    """Hand every parked session of this daemon (or of one tenant) to another daemon."""
    return _moves(request).drain_to(body.to, body.to_token, body.tenant)


@router.post(
    "/in",
    responses=error_responses(
        InvalidRequestError,
        PayloadTooLargeError,
        SessionExistsError,
        LayoutMismatchError,
        TierFullError,
        NotReadyError,
    ),
)
def begin_import(request: Request, body: MoveManifest) -> BeginAnswer:
    """(Called by a source daemon.) Reserve room for a session by content; the blocks
    this daemon still needs. 507 without room, 409 for another model or layout."""
    return _moves(request).importer.begin(body)


@router.post(
    "/in-batch",
    responses=error_responses(InvalidRequestError, PayloadTooLargeError),
)
def begin_batch(request: Request, body: BatchBegin) -> BatchBeginAnswer:
    """(Called by a source daemon.) Begin the moves of many sessions: each one's answer,
    or why it was refused (507, 409, ...), and where ``data`` was asked and this daemon
    serves its data port, the one-time ticket of a data connection for all their
    missing blocks."""
    return _moves(request).imports.begin(body)


@router.post(
    "/in-batch/commit",
    responses=error_responses(InvalidRequestError, StorageUnavailableError),
)
def commit_batch(request: Request, body: BatchCommit) -> BatchCommitAnswer:
    """(Called by a source daemon.) Park every complete session of the batch here, in
    one transaction: from now on this daemon owns them. Each one's answer or refusal."""
    return _moves(request).imports.commit(body)


@router.put(
    "/in/{move_id}/blocks",
    responses=error_responses(InvalidRequestError, PayloadTooLargeError),
)
async def put_blocks(request: Request, move_id: str) -> ChunkAnswer:
    """(Called by a source daemon.) Blocks in wire form, each verified against its digest
    before any is written; the header names their indices."""
    raw = request.headers.get(BLOCKS_HEADER, "")
    try:
        indices = [int(i) for i in raw.split(",") if i]
    except ValueError:
        raise InvalidRequestError(f"{BLOCKS_HEADER} must be block indices") from None
    body = await request.body()
    return await run_in_threadpool(_moves(request).importer.chunk, move_id, indices, body)


@router.post(
    "/in/{move_id}/commit",
    responses=error_responses(InvalidRequestError, SessionExistsError, StorageUnavailableError),
)
def commit_import(request: Request, move_id: str) -> CommitAnswer:
    """(Called by a source daemon.) Park the session here: from now on this daemon owns it."""
    return _moves(request).importer.commit(move_id)


@router.delete(
    "/in/{move_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=error_responses(InvalidRequestError),
)
def abort_import(request: Request, move_id: str) -> Response:
    """(Called by a source daemon.) Give up an import: its reserved slots are freed."""
    _moves(request).importer.abort(move_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
