"""/v1/vllm: where a vLLM connector finds the daemon's control socket (asked once)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from agentpark.api.deps import AUTH_ERRORS, SessionsCaller
from agentpark.api.errors_wire import error_responses
from agentpark.connectors.protocol import PROTOCOL
from agentpark.errors import InvalidStateError

__all__ = ["VllmInfo", "router"]

router = APIRouter()


class VllmInfo(BaseModel):
    protocol: int = Field(description="control protocol version")
    tenant: str = Field(description="the token's tenant: the connector's sessions belong to it")
    control_socket: str = Field(description="unix socket the connector talks to (0600)")
    pool_path: str = Field(
        description="the host pool file (/dev/shm); not made when pool_held_by is set"
    )
    pool_capacity_bytes: int
    pool_held_by: str | None = Field(
        None,
        description=(
            "the engine's DMA backend that holds the parked bytes in its own memory "
            "(tpu_sync: vLLM on TPU): no pool file, no checksums; null: the pool file"
        ),
    )
    degraded: dict[str, int] = Field(
        description="requests of the caller's tenant that its connectors served without "
        "agentpark, by cause (a fixed set; unknown ones count as 'other'). Only the tenant's "
        "own: the daemon-wide counts are agentpark_vllm_degraded_total on /metrics"
    )


@router.get(
    "/v1/vllm",
    tags=["vllm"],
    responses=error_responses(InvalidStateError, *AUTH_ERRORS),
)
def get_vllm(caller: SessionsCaller) -> VllmInfo:
    """The control socket and pool of a daemon serving vLLM ([vllm] enabled); 409 if not.

    Needs the ``sessions`` scope: the connector's sessions belong to its token's tenant
    (the tenant comes from the token, never from the connector's own configuration: the
    connector presents the same token in the control socket's ``hello``). ``degraded``
    holds the caller's tenant's counts only, never another tenant's or the daemon's own.
    """
    service = caller.runtime.vllm
    if service is None:
        raise InvalidStateError("this daemon does not serve vLLM: set [vllm] enabled = true")
    return VllmInfo(
        protocol=PROTOCOL,
        tenant=caller.tenant,
        control_socket=str(service.socket_path),
        pool_path=str(service.pool_path),
        pool_capacity_bytes=service.capacity_bytes(),
        pool_held_by=None if service.held is None else service.held.backend,
        degraded=service.degraded.of_tenant(caller.tenant),
    )
