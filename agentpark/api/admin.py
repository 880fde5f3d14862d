"""/v1/admin: operator actions on the whole daemon."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request

from agentpark.api.deps import ADMIN, AUTH_ERRORS, OPERATOR, RuntimeDep
from agentpark.api.errors_wire import error_responses
from agentpark.errors import InvalidRequestError
from agentpark.runtime import Runtime
from agentpark.schemas.host import PolicyResponse, ReloadResponse, ToolEstimate
from agentpark.schemas.sessions import DrainResponse

__all__ = ["router"]

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.post("/drain", dependencies=[ADMIN], responses=error_responses(*AUTH_ERRORS))
def drain_daemon(runtime: RuntimeDep, request: Request) -> DrainResponse:
    """Park every session into shm/disk within shutdown.deadline_s, then stop the daemon.

    The same as SIGTERM, for an operator who wants the figures back: new work is refused
    from the first moment, and the next start restores what was parked.
    """
    summary = runtime.drain()
    _request_shutdown(request)
    return DrainResponse(**summary)


def _request_shutdown(request: Request) -> None:
    stop = getattr(request.app.state, "request_shutdown", None)
    if stop is not None:
        stop()
    else:
        log.warning("drained, but this server offers no way to stop it; stop it yourself")


@router.post(
    "/reload",
    dependencies=[ADMIN],
    responses=error_responses(InvalidRequestError, *AUTH_ERRORS),
)
def reload_policy(runtime: RuntimeDep) -> ReloadResponse:
    """Re-read the config file's policy section; a bad file is refused (422), old one stays."""
    return ReloadResponse(reloaded=True, policy=runtime.reload_policy())


@router.get("/policy", dependencies=[OPERATOR], responses=error_responses(*AUTH_ERRORS))
def get_policy(runtime: RuntimeDep) -> PolicyResponse:
    """The policy in force, and what the daemon has learned about tool pauses (operator).

    The tool names come from every tenant's pauses: an operator view, like /v1/host/parked.
    """
    return _policy_view(runtime)


def _policy_view(runtime: Runtime) -> PolicyResponse:
    policy = runtime.policy
    tools = {
        name: ToolEstimate(expected_s=policy.tools.expected(name, policy.config)[0], observed=n)
        for name, n in policy.tools.summary().items()
    }
    return PolicyResponse(
        policy=policy.config, bandwidth_bps=runtime.parking.bandwidth_bps, tools=tools
    )
