"""/v1/sessions: the life cycle an orchestrator drives."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, Response, status

from agentpark.api.deps import ParkingDep, ReadyDriverDep, ReadyParkingDep, TenantDep
from agentpark.api.schemas import (
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
from agentpark.errors import InvalidRequestError
from agentpark.parking import PauseOrder

__all__ = ["router"]

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

STATES = "active|pausing|parked|resuming|recomputing|lost|deleted"


@router.post("", status_code=status.HTTP_201_CREATED)
def create_session(
    parking: ParkingDep, tenant: TenantDep, body: Annotated[SessionCreate | None, Body()] = None
) -> SessionOut:
    body = body or SessionCreate()
    return SessionOut.of(parking.create(tenant, body.session_id, body.metadata))


@router.get("")
def list_sessions(
    parking: ParkingDep,
    tenant: TenantDep,
    state: Annotated[str | None, Query(pattern=f"^({STATES})$")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
) -> SessionPage:
    after = 0
    if cursor is not None:
        if not cursor.isdigit():
            raise InvalidRequestError("cursor is not one this API returned", cursor=cursor)
        after = int(cursor)
    rows = parking.page(tenant, state, limit, after)
    next_cursor = str(rows[-1].seq) if len(rows) == limit else None
    return SessionPage(sessions=[SessionOut.of(r) for r in rows], next_cursor=next_cursor)


@router.get("/{session_id}")
def get_session(parking: ParkingDep, tenant: TenantDep, session_id: str) -> SessionOut:
    return SessionOut.of(parking.get(tenant, session_id))


@router.delete("/{session_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_session(parking: ParkingDep, tenant: TenantDep, session_id: str) -> Response:
    parking.delete(tenant, session_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{session_id}/generate")
def generate_tokens(
    driver: ReadyDriverDep, tenant: TenantDep, session_id: str, body: GenerateRequest
) -> GenerateResponse:
    prompt = body.prompt_tokens or []
    if body.prompt is not None:
        prompt = driver.tokenize(body.prompt)
    result = driver.generate(
        tenant, session_id, prompt, body.max_new_tokens, body.temperature, body.seed
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


WaitQuery = Annotated[
    bool,
    Query(description="false: answer 202 as soon as the copy has started; GET shows the end"),
]


@router.post("/{session_id}/pause", responses={202: {"model": PauseResponse}})
def pause_session(
    parking: ReadyParkingDep,
    tenant: TenantDep,
    session_id: str,
    response: Response,
    body: Annotated[PauseRequest | None, Body()] = None,
    wait: WaitQuery = True,
) -> PauseResponse:
    """The agent called a tool: park its KV, unless the pause is too short to be worth it."""
    body = body or PauseRequest()
    order = PauseOrder(body.tier, body.tool, body.expected_resume_s, body.force)
    result = parking.pause(tenant, session_id, order, wait=wait)
    if result.pause_ms is None:
        response.status_code = status.HTTP_202_ACCEPTED
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


@router.post("/{session_id}/resume", responses={202: {"model": ResumeResponse}})
def resume_session(
    parking: ReadyParkingDep,
    tenant: TenantDep,
    session_id: str,
    response: Response,
    wait: WaitQuery = True,
) -> ResumeResponse:
    result = parking.resume(tenant, session_id, wait=wait)
    if result.resume_ms is None:
        response.status_code = status.HTTP_202_ACCEPTED
    return ResumeResponse(
        session_id=session_id,
        state=result.row.state,
        restored_from=result.restored_from,
        resume_ms=result.resume_ms,
    )


@router.post("/{session_id}/move")
def move_session(
    parking: ReadyParkingDep, tenant: TenantDep, session_id: str, body: MoveRequest
) -> MoveResponse:
    """Move a parked session's copy to another tier; it stays parked."""
    result = parking.move(tenant, session_id, body.tier)
    return MoveResponse(
        session_id=session_id,
        state=result.row.state,
        from_tier=result.from_tier,
        tier=result.row.tier,
        kv_bytes=result.row.kv_bytes,
        move_ms=result.move_ms,
    )
