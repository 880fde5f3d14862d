"""FastAPI dependencies: the runtime's parts and the caller's tenant, as Annotated aliases.

They are ``async`` on purpose: they only read attributes, and a sync dependency costs a
hop to the thread pool and back on every request (a third of a millisecond each here).
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Depends, Header, Request

from agentpark.errors import InvalidRequestError, InvalidStateError, NotReadyError
from agentpark.parking import InProcessDriver, SessionCore
from agentpark.runtime import Runtime

__all__ = [
    "ParkingDep",
    "ReadyDriverDep",
    "ReadyParkingDep",
    "ReadyRuntimeDep",
    "RuntimeDep",
    "TenantDep",
]

TENANT_HEADER = "X-Agentpark-Tenant"
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def get_parking(runtime: RuntimeDep) -> SessionCore:
    return runtime.parking


async def get_ready_parking(runtime: RuntimeDep) -> SessionCore:
    """For routes that run the engine: 503 until warm-up has finished."""
    if not runtime.ready.is_set():
        raise NotReadyError("the engine is still warming up; retry shortly")
    return runtime.parking


async def get_tenant(
    x_agentpark_tenant: Annotated[str | None, Header(alias=TENANT_HEADER)] = None,
) -> str:
    """The caller's tenant; sessions of one tenant are invisible to every other."""
    tenant = x_agentpark_tenant or "default"
    if not _TENANT_RE.match(tenant):
        raise InvalidRequestError(
            f"{TENANT_HEADER} must be 1-128 letters, digits or ._-", tenant=tenant
        )
    return tenant


async def get_ready_runtime(runtime: RuntimeDep) -> Runtime:
    """The runtime, for routes that run the engine: 503 until warm-up has finished."""
    if not runtime.ready.is_set():
        raise NotReadyError("the engine is still warming up; retry shortly")
    return runtime


ReadyRuntimeDep = Annotated[Runtime, Depends(get_ready_runtime)]
ParkingDep = Annotated[SessionCore, Depends(get_parking)]
ReadyParkingDep = Annotated[SessionCore, Depends(get_ready_parking)]


async def get_ready_driver(runtime: ReadyRuntimeDep) -> InProcessDriver:
    """The engine driver (generate), for routes that run the engine: 503 until warm."""
    if runtime.driver is None:
        raise InvalidStateError(
            "this daemon serves vLLM: generate through vLLM's OpenAI API with "
            "kv_transfer_params.agentpark.session_id"
        )
    return runtime.driver


ReadyDriverDep = Annotated[InProcessDriver, Depends(get_ready_driver)]
TenantDep = Annotated[str, Depends(get_tenant)]
