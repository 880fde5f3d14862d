"""What happened to a request: a session's last turns, and one request's turn by its id."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from starlette.concurrency import run_in_threadpool

from agentpark.api.deps import AUTH_ERRORS, Caller, SessionsCaller
from agentpark.api.errors_wire import error_responses
from agentpark.control.ops import REQUEST_ID_RE
from agentpark.errors import InvalidRequestError, RequestNotFoundError, SessionNotFoundError
from agentpark.schemas.turns import TurnOut, TurnPage
from agentpark.turns import MAX_TURNS, Turns

__all__ = ["MAX_WAIT_S", "router"]

MAX_WAIT_S = 10.0
"""The longest ``GET /v1/requests/{id}?wait_s=`` waits for a turn's end."""

router = APIRouter(tags=["turns"], responses=error_responses(*AUTH_ERRORS))


def _turns(caller: Caller) -> Turns:
    core = caller.parking
    geometry = core.geometry
    return Turns(core.store, geometry.block_size, geometry.block_nbytes)


@router.get(
    "/v1/sessions/{session_id}/turns",
    responses=error_responses(SessionNotFoundError, InvalidRequestError),
)
async def list_turns(
    caller: SessionsCaller,
    session_id: str,
    limit: Annotated[int, Query(ge=1, le=MAX_TURNS)] = 20,
) -> TurnPage:
    """The session's last ``limit`` turns, newest first: per engine request, what
    agentpark did (restored, parked, kept...), why, from and into which tier, how long
    it took and how many bytes moved. A deleted session's turns stay readable; an
    unknown session is 404."""
    turns = _turns(caller)
    tenant = caller.tenant
    if caller.parking.live_row(tenant, session_id) is None:
        row = await run_in_threadpool(caller.parking.store.get, tenant, session_id)
        if row is None:
            raise SessionNotFoundError(session_id)
    found = await run_in_threadpool(turns.of_session, tenant, session_id, limit)
    return TurnPage(turns=found)


@router.get(
    "/v1/requests/{request_id}",
    responses=error_responses(RequestNotFoundError, InvalidRequestError),
)
async def get_request(
    caller: SessionsCaller,
    request: Request,
    request_id: Annotated[
        str,
        Path(
            max_length=256,
            pattern=REQUEST_ID_RE,
            description="the engine's request id, or the id the client saw: a chat "
            "completion's `id` (`chatcmpl-...`) names the request vLLM ran",
        ),
    ],
    wait_s: Annotated[
        float,
        Query(
            ge=0.0,
            le=MAX_WAIT_S,
            description="wait up to this long for the turn's end to be recorded (the "
            "engine copies a parked turn just after the answer's last chunk)",
        ),
    ] = 0.0,
) -> TurnOut:
    """What agentpark did for one engine request (vLLM's); 404 ``request_not_found`` when
    no event names it (it named no session, has not reached agentpark yet, or its
    events were pruned). With ``wait_s``, the answer comes as soon as the turn's end is
    recorded (``ended``), or after ``wait_s`` with what is recorded by then."""
    turns = _turns(caller)
    if wait_s > 0:
        return await turns.ended(request.app.state.streams, caller.tenant, request_id, wait_s)
    return await run_in_threadpool(turns.of_request, caller.tenant, request_id)
