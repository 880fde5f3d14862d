"""FastAPI dependencies: the runtime's parts, the caller's identity and tenant.

They are ``async`` on purpose: they read attributes (and the token's row, a primary-key
read of a few tens of microseconds), and a sync dependency costs a hop to the thread pool
and back on every request (a third of a millisecond each here).

The hot routes (``/v1/sessions``, ``/v1/events``, ``/v1/host``, ``/v1/vllm``) take ONE
dependency, a :class:`Caller` (``SessionsCaller``, ``ReadySessionsCaller``,
``OperatorCaller``): the bearer check, the scope check, the tenant and (``Ready...``) the
503 of an engine warming up, in one function. FastAPI walks a route's dependency tree on
every request, a cached node included, at tens of microseconds a node (the tree was nine
nodes deep). With the read-only ones ``async`` too, a raw HTTP/1.1 ``GET`` of a session on
loopback went from 1.07 to 0.55 ms (p50, this 2-core machine). The other routes guard
with ``OPERATOR``/``ADMIN`` in ``dependencies=``.

Each guard is a FastAPI ``Security`` dependency on :data:`BEARER`, so the OpenAPI spec
lists the ``HTTPBearer`` scheme on every guarded route; :data:`AUTH_ERRORS` are the answers
each guarded route documents. The ``X-Agentpark-Tenant`` header of earlier versions is
refused (400) on every guarded route: ignoring it would put an old client's sessions in
another tenant without it knowing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
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
    "Caller",
    "OperatorCaller",
    "ReadySessionsCaller",
    "RuntimeDep",
    "SessionsCaller",
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
# The parsed header is not used (see _identify); the node puts the scheme in OpenAPI.
_Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]


async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asks (the token's tenant) and the runtime it asks: a hot route's one dependency."""

    tenant: str
    runtime: Runtime

    @property
    def parking(self) -> SessionCore:
        return self.runtime.parking

    @property
    def driver(self) -> InProcessDriver:
        """The engine driver (generate); 409 on a daemon that serves vLLM."""
        if self.runtime.driver is None:
            raise InvalidStateError(
                "this daemon serves vLLM: generate through vLLM's OpenAI API with "
                "kv_transfer_params.agentpark.session_id"
            )
        return self.runtime.driver


async def _identify(request: Request) -> Identity:
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


def _check_scope(identity: Identity, scope: Scope) -> None:
    """401 for the loopback default on a scope it lacks, 403 for a token without it."""
    if scope in identity.scopes:
        return
    if identity.token_id is None:  # the loopback default never reaches admin
        raise UnauthenticatedError(
            f"this route needs a token with the {scope.value!r} scope, even on "
            f"loopback (agentpark token create --tenant NAME --scope {scope.value})"
        )
    raise MissingScopeError(scope.value, identity.token_id, sorted(identity.scopes))


def _require(scope: Scope) -> Callable[..., Awaitable[Identity]]:
    async def guard(request: Request, _bearer: _Bearer) -> Identity:
        identity = await _identify(request)
        _check_scope(identity, scope)
        return identity

    guard.__name__ = f"require_{scope.value}"
    return guard


# For a route's (or router's) ``dependencies=``: the guard runs before anything else the
# route needs (a 401 before a 503 of an engine warming up, or a 422 of the body).
OPERATOR = Security(_require(Scope.OPERATOR))
ADMIN = Security(_require(Scope.ADMIN))


def _caller(scope: Scope, *, ready: bool) -> Callable[..., Awaitable[Caller]]:
    """The one dependency of a hot route: the guard, then (``ready``) the warm-up's 503."""

    async def caller(request: Request, _bearer: _Bearer) -> Caller:
        identity = await _identify(request)
        _check_scope(identity, scope)
        runtime: Runtime = request.app.state.runtime
        if ready and not runtime.ready.is_set():
            raise NotReadyError("the engine is still warming up; retry shortly")
        return Caller(identity.tenant, runtime)

    caller.__name__ = f"{'ready_' if ready else ''}{scope.value}_caller"
    return caller


# Sessions of one tenant are invisible to every other: routes read caller.tenant.
SessionsCaller = Annotated[Caller, Security(_caller(Scope.SESSIONS, ready=False))]
ReadySessionsCaller = Annotated[Caller, Security(_caller(Scope.SESSIONS, ready=True))]
OperatorCaller = Annotated[Caller, Security(_caller(Scope.OPERATOR, ready=False))]
