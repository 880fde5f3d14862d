"""/v1/host, /v1/events and the health probes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from agentpark.api.deps import ParkingDep, RuntimeDep, TenantDep
from agentpark.api.schemas import EventOut, EventPage
from agentpark.snapshot import HostSnapshot

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/host", tags=["host"])
def get_host(runtime: RuntimeDep) -> HostSnapshot:
    """Pool totals, HBM reclaimed by parking, tier use, sessions by state, counters."""
    return runtime.host_snapshot()


@router.get("/v1/events", tags=["host"])
def list_events(
    parking: ParkingDep,
    tenant: TenantDep,
    session_id: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> EventPage:
    """Transitions with their durations and bytes, newest first."""
    return EventPage(
        events=[EventOut.of(e) for e in parking.list_events(tenant, session_id, limit)]
    )


@router.get("/healthz", tags=["health"])
def get_healthz() -> dict[str, str]:
    """The process answers (liveness)."""
    return {"status": "ok"}


@router.get("/readyz", tags=["health"], response_model=None)
def get_readyz(runtime: RuntimeDep) -> dict[str, str] | JSONResponse:
    """The engine is warm and sessions can be served (readiness)."""
    if runtime.ready.is_set():
        return {"status": "ready"}
    body = {"error": {"code": "not_ready", "message": "the engine is still warming up"}}
    return JSONResponse(body, status_code=503)
