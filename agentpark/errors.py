"""Every error agentpark raises on purpose, and the one HTTP status each maps to.

The hierarchy::

    AgentparkError                      500 internal_error
    ├── ConfigError                     500 config_error (start-up only: never served)
    ├── TenantHeaderError               400 tenant_header_refused
    ├── UnauthenticatedError            401 unauthenticated
    ├── MissingScopeError               403 insufficient_scope
    ├── NotFoundError                   404
    │   ├── SessionNotFoundError        404 session_not_found
    │   └── TokenNotFoundError          404 token_not_found
    ├── ConflictError                   409
    │   ├── SessionExistsError          409 session_exists
    │   ├── SessionBusyError            409 session_busy
    │   ├── InvalidStateError           409 invalid_state
    │   └── ContextFullError            409 context_full
    ├── InvalidRequestError             422 invalid_request
    │   └── LimitExceededError          422 limit_exceeded
    ├── PayloadTooLargeError            413 payload_too_large
    ├── AuthThrottledError              429 auth_throttled
    ├── CapacityError                   507
    │   ├── PoolFullError               507 pool_full
    │   └── TierFullError               507 tier_full
    ├── NotReadyError                   503 not_ready
    ├── StorageUnavailableError         503 storage_unavailable
    └── TransferError                   500 transfer_failed

Each class carries its HTTP status and a stable machine-readable ``code``, and nothing
else maps an error to a status: the API layer turns any of them into
``{"error": {"code": ..., "message": ..., "details": {...}}}`` without a per-route mapping,
and :mod:`agentpark.api.errors_wire` documents them in the OpenAPI spec from the same two
attributes. This module is on the bottom floor: it imports no web framework and no wire
model, so every module may raise these; the status is only a number here.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

__all__ = [
    "AgentparkError",
    "AuthThrottledError",
    "CapacityError",
    "ConfigError",
    "ConflictError",
    "ContextFullError",
    "InvalidRequestError",
    "InvalidStateError",
    "LimitExceededError",
    "MissingScopeError",
    "NotFoundError",
    "NotReadyError",
    "PayloadTooLargeError",
    "PoolFullError",
    "RequestNotFoundError",
    "SessionBusyError",
    "SessionExistsError",
    "SessionNotFoundError",
    "StorageUnavailableError",
    "TenantHeaderError",
    "TierFullError",
    "TokenNotFoundError",
    "TooManyStreamsError",
    "TransferError",
    "UnauthenticatedError",
]


class AgentparkError(Exception):
    """Base of every deliberate error; ``status`` and ``code`` drive the HTTP answer."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    served: ClassVar[bool] = True  # False: raised before the app serves; never an answer

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        # Headers set by the error itself (WWW-Authenticate of a 401), beside Retry-After.
        self.extra_headers: dict[str, str] = {}

    @property
    def headers(self) -> dict[str, str]:
        """HTTP headers of the answer: ``Retry-After`` when ``details`` has
        ``retry_after_s`` (a time-out that may pass, a store that may come back)."""
        headers = dict(self.extra_headers)
        retry = self.details.get("retry_after_s")
        if retry is not None:
            headers["Retry-After"] = str(max(1, math.ceil(float(retry))))
        return headers

    def to_body(self) -> dict[str, Any]:
        """The JSON error envelope the API returns."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return {"error": body}


class ConfigError(AgentparkError):
    """Settings that fail validation; stops the daemon before it serves anything.

    Its status (500, inherited) is never sent: a reload that reads a bad file answers
    ``invalid_request`` instead, so no route documents this class.
    """

    code = "config_error"
    served = False


class TenantHeaderError(AgentparkError):
    """The request sets X-Agentpark-Tenant; the tenant comes from the bearer token only."""

    status = 400
    code = "tenant_header_refused"

    def __init__(self, header: str) -> None:
        super().__init__(
            f"{header} is refused: the tenant comes from the bearer token "
            "(agentpark token create --tenant NAME), never from a header",
            header=header,
        )


class UnauthenticatedError(AgentparkError):
    """No bearer token, or one that is unknown, malformed or revoked."""

    status = 401
    code = "unauthenticated"

    def __init__(self, message: str, *, invalid_token: bool = False, **details: Any) -> None:
        super().__init__(message, **details)
        # RFC 6750: the challenge names the scheme, and error="invalid_token" when a
        # token was sent but is not one this daemon accepts.
        challenge = 'Bearer realm="agentpark"'
        if invalid_token:
            challenge += ', error="invalid_token"'
        self.extra_headers["WWW-Authenticate"] = challenge


class MissingScopeError(AgentparkError):
    """The token is valid but lacks the scope this route needs."""

    status = 403
    code = "insufficient_scope"

    def __init__(self, scope: str, token_id: str | None, scopes: list[str]) -> None:
        super().__init__(
            f"this route needs a token with the {scope!r} scope; this one has "
            f"{', '.join(scopes) or 'none'} (agentpark token create --scope {scope})",
            scope=scope,
            token_id=token_id,
            scopes=scopes,
        )
        self.extra_headers["WWW-Authenticate"] = (
            f'Bearer realm="agentpark", error="insufficient_scope", scope="{scope}"'
        )


class NotFoundError(AgentparkError):
    """Something the request names does not exist."""

    status = 404
    code = "not_found"


class SessionNotFoundError(NotFoundError):
    """No session with this id for the caller's tenant."""

    code = "session_not_found"

    def __init__(self, session_id: str, *, deleted_at: float | None = None) -> None:
        if deleted_at is None:
            super().__init__(f"session {session_id!r} not found", session_id=session_id)
            return
        # A deleted session is gone as a resource; its history stays in the events.
        super().__init__(
            f"session {session_id!r} was deleted; its history: "
            f"GET /v1/events?session_id={session_id}",
            session_id=session_id,
            deleted_at=deleted_at,
        )


class TokenNotFoundError(NotFoundError):
    """No token with this id (``agentpark token list`` shows the ids)."""

    code = "token_not_found"

    def __init__(self, token_id: str) -> None:
        super().__init__(f"token {token_id!r} not found", token_id=token_id)


class RequestNotFoundError(NotFoundError):
    """No event of the caller's tenant names this engine request (yet, or any more)."""

    code = "request_not_found"

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"no turn of request {request_id!r}: agentpark recorded nothing for it (it "
            "named no session, has not ended, or its events were pruned)",
            request_id=request_id,
        )


class ConflictError(AgentparkError):
    """The request clashes with the session's current state."""

    status = 409
    code = "conflict"


class SessionExistsError(ConflictError):
    """The tenant already has a session with this id."""

    code = "session_exists"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} already exists", session_id=session_id)


class SessionBusyError(ConflictError):
    """Another operation holds the session; agentpark refuses rather than queues."""

    code = "session_busy"

    def __init__(self, session_id: str, operation: str, in_flight: str, **details: Any) -> None:
        super().__init__(
            f"cannot {operation} session {session_id!r}: a {in_flight} is in flight",
            session_id=session_id,
            operation=operation,
            in_flight=in_flight,
            **details,
        )


class InvalidStateError(ConflictError):
    """The session's state does not allow this operation (e.g. resume an active one)."""

    code = "invalid_state"


class ContextFullError(ConflictError):
    """The session cannot hold that many tokens: the model's context or the whole pool."""

    code = "context_full"


class InvalidRequestError(AgentparkError):
    """The request is malformed or names something unknown (body, query or header)."""

    status = 422
    code = "invalid_request"


class LimitExceededError(InvalidRequestError):
    """The request can never succeed on this host: it exceeds a model or pool limit."""

    code = "limit_exceeded"


class PayloadTooLargeError(AgentparkError):
    """The request body, or a part of it, is over a configured size limit."""

    status = 413
    code = "payload_too_large"


class AuthThrottledError(AgentparkError):
    """Too many failed authentications from this address; retry after Retry-After."""

    status = 429
    code = "auth_throttled"

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(
            "too many requests with a missing or invalid token from this address; "
            "a valid token is still accepted",
            retry_after_s=retry_after_s,
        )


class TooManyStreamsError(AgentparkError):
    """Every event-stream subscription allowed (the tenant's, or the daemon's) is taken."""

    status = 429
    code = "too_many_streams"

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message, limit=limit, retry_after_s=5)


class CapacityError(AgentparkError):
    """Not enough room right now (KV pool or host tiers)."""

    status = 507
    code = "insufficient_storage"


class PoolFullError(CapacityError):
    """The KV pool has too few free blocks right now; retrying later may work."""

    code = "pool_full"


class TierFullError(CapacityError):
    """No host tier has room for the parked copy; the session stays where it was."""

    code = "tier_full"


class NotReadyError(AgentparkError):
    """The engine is still warming up, or the daemon is draining; retry later."""

    status = 503
    code = "not_ready"


class StorageUnavailableError(AgentparkError):
    """The database refused a write (disk full, I/O error, locked); nothing changed.

    The operation is rolled back in memory too, /readyz says not ready, and the daemon
    comes back by itself as soon as a write succeeds again; retry after Retry-After.
    """

    status = 503
    code = "storage_unavailable"


class TransferError(AgentparkError):
    """A copy between the pool and a tier failed; nothing was freed."""

    code = "transfer_failed"
