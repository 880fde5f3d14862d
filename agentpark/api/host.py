"""/v1/host, /v1/events and the health probes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from agentpark.api.deps import AUTH_ERRORS, OperatorCaller, RuntimeDep, SessionsCaller
from agentpark.api.errors_wire import error_responses
from agentpark.errors import (
    InvalidRequestError,
    NotReadyError,
    StorageUnavailableError,
)
from agentpark.schemas.host import LivenessResponse, ReadinessResponse
from agentpark.schemas.sessions import EventOut, EventPage
from agentpark.snapshot import HostSnapshot

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/host", tags=["host"], responses=error_responses(*AUTH_ERRORS))
async def get_host(caller: OperatorCaller) -> HostSnapshot:
    """Pool totals, HBM reclaimed by parking, tier use, sessions by state, counters.

    ``async``: the figures are in memory (counters and tallies under short locks), so the
    event loop answers without a thread-pool hop.
    """
    return caller.runtime.host_snapshot()


@router.get(
    "/v1/events",
    tags=["host"],
    responses=error_responses(InvalidRequestError, *AUTH_ERRORS),
)
def list_events(
    caller: SessionsCaller,
    session_id: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> EventPage:
    """The tenant's transitions with their durations and bytes, newest first."""
    events = caller.parking.list_events(caller.tenant, session_id, limit)
    return EventPage(events=[EventOut.of(e) for e in events])


@router.get("/healthz", tags=["health"])
async def get_liveness() -> LivenessResponse:
    """The process answers (liveness)."""
    return LivenessResponse()


@router.get(
    "/readyz",
    tags=["health"],
    responses=error_responses(NotReadyError, StorageUnavailableError),
)
def get_readiness(runtime: RuntimeDep) -> ReadinessResponse:
    """The engine is warm and sessions can be served (readiness); 503 until then, and
    while database writes fail (until one succeeds again)."""
    if not runtime.ready.is_set():
        raise NotReadyError("the engine is still warming up")
    health = runtime.store.health
    if not health.ok:
        raise StorageUnavailableError(
            f"database writes fail: {health.error}", since=health.since, retry_after_s=5
        )
    return ReadinessResponse()
