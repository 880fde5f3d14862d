"""FastAPI dependencies: the runtime's parts, the caller's identity and tenant.

They are ``async`` on purpose: they read attributes (and the token's row, a primary-key
read of a few tens of microseconds), and a sync dependency costs a hop to the thread pool
and back on every request (a third of a millisecond each here).

Guards: ``TenantDep`` (the ``sessions`` scope; the tenant is the token's), and
``OPERATOR``/``ADMIN`` for a route's ``dependencies=``. Each is a FastAPI ``Security``
dependency on :data:`BEARER`, so the OpenAPI spec lists the ``HTTPBearer`` scheme on every
guarded route; :data:`AUTH_ERRORS` are the answers each guarded route documents. The
``X-Agentpark-Tenant`` header of earlier versions is refused (400) on every guarded route:
ignoring it would put an old client's sessions in another tenant without it knowing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from agentpark.auth import Gate, Identity, Scope
from agentpark.errors import (
    InvalidStateError,
    MissingScopeError,
    NotReadyError,
    TenantHeaderError,
    UnauthenticatedError,
)
from agentpark.parking import InProcessDriver, SessionCore
from agentpark.runtime import Runtime

__all__ = [
    "ADMIN",
    "AUTH_ERRORS",
    "BEARER",
    "OPERATOR",
    "SESSIONS",
    "IdentityDep",
    "ParkingDep",
    "ReadyDriverDep",
    "ReadyParkingDep",
    "ReadyRuntimeDep",
    "RuntimeDep",
    "TenantDep",
]

TENANT_HEADER = "X-Agentpark-Tenant"
log = logging.getLogger(__name__)

BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    bearerFormat="apk_<id>_<secret>",
    description="an agentpark token (agentpark token create --tenant NAME --scope SCOPE); "
    "on a loopback daemon with no token in its database, requests without one run as "
    "tenant 'default' with the sessions and operator scopes",
)
# What every guarded route can answer besides its own errors.
AUTH_ERRORS = (TenantHeaderError, UnauthenticatedError, MissingScopeError)


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


async def _identity(
    request: Request,
    _bearer: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)],
) -> Identity:
    """Who the request is (the token's tenant and scopes); 400/401 as the module says."""
    if TENANT_HEADER.lower() in request.headers:
        raise TenantHeaderError(TENANT_HEADER)
    gate: Gate = request.app.state.gate
    # The raw header, not HTTPBearer's parse: it returns None for "Basic ..." too, and a
    # wrong scheme must be a 401 that says so, not an anonymous request.
    identity = gate.identify(request.headers.get("authorization"))
    if identity.token_id is not None and (at := gate.due_for_touch(identity.token_id)):
        try:
            await run_in_threadpool(gate.store.touch, identity.token_id, at)
        except Exception:  # last_used_at is a convenience; never fail a request for it
            log.warning("could not record the use of token %s", identity.token_id)
    return identity


IdentityDep = Annotated[Identity, Depends(_identity)]


def _require(scope: Scope) -> Callable[[Identity], Awaitable[Identity]]:
    async def guard(identity: IdentityDep) -> Identity:
        if scope not in identity.scopes:
            if identity.token_id is None:  # the loopback default never reaches admin
                raise UnauthenticatedError(
                    f"this route needs a token with the {scope.value!r} scope, even on "
                    f"loopback (agentpark token create --tenant NAME --scope {scope.value})"
                )
            raise MissingScopeError(scope.value, identity.token_id, sorted(identity.scopes))
        return identity

    guard.__name__ = f"require_{scope.value}"
    return guard


_require_sessions = _require(Scope.SESSIONS)
# For a route's (or router's) ``dependencies=``: the guard runs before anything else the
# route needs (a 401 before a 503 of an engine warming up, or a 422 of the body).
SESSIONS = Security(_require_sessions)
OPERATOR = Security(_require(Scope.OPERATOR))
ADMIN = Security(_require(Scope.ADMIN))


async def get_tenant(identity: Annotated[Identity, Security(_require_sessions)]) -> str:
    """The caller's tenant: the token's; sessions of one tenant are invisible to every other."""
    return identity.tenant


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
