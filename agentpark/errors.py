"""Every error agentpark raises on purpose, and the one HTTP status each maps to.

The hierarchy::

    AgentparkError                      500 internal_error
    ├── ConfigError                     (start-up only: bad settings, never served)
    ├── NotFoundError                   404
    │   └── SessionNotFoundError        404 session_not_found
    ├── ConflictError                   409
    │   ├── SessionExistsError          409 session_exists
    │   ├── SessionBusyError            409 session_busy
    │   └── InvalidStateError           409 invalid_state
    ├── InvalidRequestError             422 invalid_request
    │   └── LimitExceededError          422 limit_exceeded
    ├── CapacityError                   507
    │   ├── PoolFullError               507 pool_full
    │   └── TierFullError               507 tier_full
    ├── NotReadyError                   503 not_ready
    └── TransferError                   500 transfer_failed

Each class carries its HTTP status and a stable machine-readable ``code``; the API layer
turns any of them into ``{"error": {"code": ..., "message": ..., "details": {...}}}``
without a per-route mapping. Modules below the API raise these and know no HTTP.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentparkError",
    "CapacityError",
    "ConfigError",
    "ConflictError",
    "InvalidRequestError",
    "InvalidStateError",
    "LimitExceededError",
    "NotFoundError",
    "NotReadyError",
    "PoolFullError",
    "SessionBusyError",
    "SessionExistsError",
    "SessionNotFoundError",
    "TierFullError",
    "TransferError",
]


class AgentparkError(Exception):
    """Base of every deliberate error; ``status`` and ``code`` drive the HTTP answer."""

    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_body(self) -> dict[str, Any]:
        """The JSON error envelope the API returns."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return {"error": body}


class ConfigError(AgentparkError):
    """Settings that fail validation; stops the daemon before it serves anything."""

    code = "config_error"


class NotFoundError(AgentparkError):
    status = 404
    code = "not_found"


class SessionNotFoundError(NotFoundError):
    code = "session_not_found"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} not found", session_id=session_id)


class ConflictError(AgentparkError):
    status = 409
    code = "conflict"


class SessionExistsError(ConflictError):
    code = "session_exists"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} already exists", session_id=session_id)


class SessionBusyError(ConflictError):
    """Another operation holds the session; agentpark refuses rather than queues."""

    code = "session_busy"

    def __init__(self, session_id: str, operation: str, in_flight: str) -> None:
        super().__init__(
            f"cannot {operation} session {session_id!r}: a {in_flight} is in flight",
            session_id=session_id,
            operation=operation,
            in_flight=in_flight,
        )


class InvalidStateError(ConflictError):
    code = "invalid_state"


class InvalidRequestError(AgentparkError):
    status = 422
    code = "invalid_request"


class LimitExceededError(InvalidRequestError):
    """The request can never succeed on this host: it exceeds a model or pool limit."""

    code = "limit_exceeded"


class CapacityError(AgentparkError):
    status = 507
    code = "insufficient_storage"


class PoolFullError(CapacityError):
    """The KV pool has too few free blocks right now; retrying later may work."""

    code = "pool_full"


class TierFullError(CapacityError):
    """No host tier has room for the parked copy; the session stays where it was."""

    code = "tier_full"


class NotReadyError(AgentparkError):
    status = 503
    code = "not_ready"


class TransferError(AgentparkError):
    """A copy between the pool and a tier failed; nothing was freed."""

    code = "transfer_failed"
