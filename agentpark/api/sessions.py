"""/v1/sessions: the life cycle an orchestrator drives."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, Response, status

from agentpark.api.deps import ParkingDep, ReadyParkingDep, ReadyRuntimeDep, TenantDep
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
    parking: ReadyParkingDep, tenant: TenantDep, session_id: str, body: GenerateRequest
) -> GenerateResponse:
    if body.prompt is not None:
        prompt = parking.engine.tokenize(body.prompt)
    else:
        prompt = body.prompt_tokens or []
    result = parking.generate(
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
    runtime: ReadyRuntimeDep,
    tenant: TenantDep,
    session_id: str,
    response: Response,
    body: Annotated[PauseRequest | None, Body()] = None,
    wait: WaitQuery = True,
) -> PauseResponse:
    """The agent called a tool: park its KV, unless the pause is too short to be worth it."""
    body = body or PauseRequest()
    parking, policy = runtime.parking, runtime.policy
    parking.check_tier(body.tier)
    row = parking.get(tenant, session_id)
    expected: float | None = body.expected_resume_s
    if body.force or row.state != "active" or not policy.config.enabled:
        why = "forced by the caller" if body.force else "policy disabled or not active"
        park = True
    else:
        advice = policy.advise_pause(row.kv_bytes, body.tool, body.expected_resume_s)
        park, why, expected = advice.decision.park, advice.decision.why, advice.expected_s
    if park:
        # The learned or prior estimate stands in for the caller's: it drives prefetch too.
        result = parking.pause(tenant, session_id, body.tier, body.tool, expected, wait=wait)
        row, pause_ms = result.row, result.pause_ms
        if pause_ms is None:
            response.status_code = status.HTTP_202_ACCEPTED
    else:
        row = parking.keep(tenant, session_id, body.tool, expected, why)
        pause_ms = 0.0
    return PauseResponse(
        session_id=session_id,
        decision="parked" if park else "kept",
        why=why,
        expected_pause_s=expected,
        state=row.state,
        tier=row.tier,
        kv_bytes=row.kv_bytes,
        pause_ms=pause_ms,
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
