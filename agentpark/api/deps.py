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

Each guard is a FastAPI ``Security`` dependency on an ``HTTPBearer``, so the OpenAPI spec
lists the bearer scheme as a security requirement of every guarded route (never as an
``Authorization`` header parameter); :data:`AUTH_ERRORS` are the answers each guarded route
documents. The routes the loopback default serves (the ``sessions`` and ``operator``
scopes) are marked with a second scheme name that :func:`served_spec` rewrites: to
``[{}, {"bearer": []}]`` (a token is optional) while the daemon serves without one, else to
``[{"bearer": []}]``, so the spec a client reads says what the daemon does now.

The ``X-Agentpark-Tenant`` header of earlier versions is refused (400) on every guarded
route: ignoring it would put an old client's sessions in another tenant without it knowing.
A missing or invalid token is counted per peer (:mod:`agentpark.api.auth_limit`): past the
limit the answer is 429 with ``Retry-After``; a valid token always passes.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from agentpark.api.auth_limit import AuthLimiter
from agentpark.auth import ANONYMOUS, Gate, Identity, Scope
from agentpark.errors import (
    AuthThrottledError,
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
    "SpecLimits",
    "served_spec",
]

TENANT_HEADER = "X-Agentpark-Tenant"
log = logging.getLogger(__name__)

_BEARER_DOC = (
    "an agentpark token (agentpark token create --tenant NAME --scope SCOPE); on a loopback "
    "daemon with no token in its database, requests without one run as tenant 'default' "
    "with the sessions and operator scopes (those routes then list an empty requirement)"
)
BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    bearerFormat="apk_<id>_<secret>",
    description=_BEARER_DOC,
)
# The same scheme on the routes the loopback default serves: only a name in the generated
# spec, which served_spec replaces (the spec never shows it).
_OPEN_NAME = "bearer-or-loopback-default"
_BEARER_OR_DEFAULT = HTTPBearer(auto_error=False, scheme_name=_OPEN_NAME)
# What every guarded route can answer besides its own errors.
AUTH_ERRORS = (TenantHeaderError, UnauthenticatedError, MissingScopeError, AuthThrottledError)


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
    try:
        identity = gate.identify(request.headers.get("authorization"))
    except UnauthenticatedError:
        limiter: AuthLimiter = request.app.state.auth_limiter
        peer = request.client.host if request.client is not None else ""
        retry_after = limiter.failed(peer)
        if retry_after is not None:
            raise AuthThrottledError(retry_after) from None
        raise
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


# The Security nodes that put the scheme in the spec (their parse is not used; see
# _identify): the marked one for the scopes the loopback default has.
_TOKEN_NODE: Any = Security(BEARER)
_TOKEN_OR_DEFAULT_NODE: Any = Security(_BEARER_OR_DEFAULT)
_Credentials = HTTPAuthorizationCredentials | None


def _scheme(scope: Scope) -> Any:
    return _TOKEN_OR_DEFAULT_NODE if scope in ANONYMOUS.scopes else _TOKEN_NODE


def _require(scope: Scope) -> Callable[..., Awaitable[Identity]]:
    scheme = _scheme(scope)

    async def guard(request: Request, _bearer: _Credentials = scheme) -> Identity:
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

    scheme = _scheme(scope)

    async def caller(request: Request, _bearer: _Credentials = scheme) -> Caller:
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


@dataclass(frozen=True, slots=True)
class SpecLimits:
    """What the running daemon accepts beyond its models' types: the spec says it too, so
    a value the spec allows is never refused 422 for the daemon's configuration."""

    tiers: tuple[str, ...]  # the parking tiers enabled, fastest first
    max_new_tokens: int
    vocab_size: int | None  # None: no reference engine (vLLM mode: generate is 409)


def served_spec(
    generated: dict[str, Any], *, open_default: bool, limits: SpecLimits | None = None
) -> dict[str, Any]:
    """The spec as served: the marked routes' requirement made optional (``{}`` first)
    while the daemon serves without a token (``open_default``), else the bearer one; and,
    given ``limits``, the tiers, ``max_new_tokens`` and token ids this daemon accepts."""
    spec = copy.deepcopy(generated)
    required: list[dict[str, list[str]]] = [{BEARER.scheme_name: []}]
    for item in spec.get("paths", {}).values():
        for operation in item.values():
            security = operation.get("security")
            if security == [{_OPEN_NAME: []}]:
                operation["security"] = [{}, *required] if open_default else required
    schemes = spec.get("components", {}).get("securitySchemes", {})
    if schemes.pop(_OPEN_NAME, None) is not None and BEARER.scheme_name not in schemes:
        schemes[BEARER.scheme_name] = BEARER.model.model_dump(by_alias=True, exclude_none=True)
    if limits is not None:
        _limit_bodies(spec.get("components", {}).get("schemas", {}), limits)
    return spec


def _limit_bodies(schemas: dict[str, Any], limits: SpecLimits) -> None:
    """The request bodies' bounds that come from the configuration (see SpecLimits)."""
    if "TierChoice" in schemas:
        schemas["TierChoice"]["enum"] = ["auto", *limits.tiers]
    move = schemas.get("MoveRequest", {}).get("properties", {})
    if "tier" in move:
        move["tier"] = {"type": "string", "enum": list(limits.tiers), "title": "Tier"}
    generate = schemas.get("GenerateRequest", {}).get("properties", {})
    if "max_new_tokens" in generate:
        generate["max_new_tokens"]["maximum"] = limits.max_new_tokens
    tokens = generate.get("prompt_tokens", {})
    if limits.vocab_size is not None:
        for option in tokens.get("anyOf", []):
            if option.get("type") == "array":
                option["items"] = {"type": "integer", "minimum": 0}
                option["items"]["maximum"] = limits.vocab_size - 1
