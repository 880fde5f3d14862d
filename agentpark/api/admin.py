"""/v1/admin: operator actions on the whole daemon."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request

from agentpark.api.deps import RuntimeDep
from agentpark.api.schemas import DrainResponse

__all__ = ["router"]

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.post("/drain")
def drain_daemon(runtime: RuntimeDep, request: Request) -> DrainResponse:
    """Park every session into shm/disk within shutdown.deadline_s, then stop the daemon.

    The same as SIGTERM, for an operator who wants the figures back: new work is refused
    from the first moment, and the next start restores what was parked.
    """
    summary = runtime.drain()
    stop = getattr(request.app.state, "request_shutdown", None)
    if stop is not None:
        stop()
    else:
        log.warning("drained, but this server offers no way to stop it; stop it yourself")
    return DrainResponse(**summary)


@router.post("/reload")
def reload_policy(runtime: RuntimeDep) -> dict[str, Any]:
    """Re-read the config file's policy section; a bad file is refused (422), old one stays."""
    return {"reloaded": True, "policy": runtime.reload_policy().model_dump()}


@router.get("/policy")
def get_policy(runtime: RuntimeDep) -> dict[str, Any]:
    """The policy in force, and what the daemon has learned about tool pauses."""
    policy = runtime.policy
    tools = {
        name: {"expected_s": policy.tools.expected(name, policy.config)[0], "observed": n}
        for name, n in policy.tools.summary().items()
    }
    return {
        "policy": policy.config.model_dump(),
        "bandwidth_bps": runtime.parking.bandwidth_bps,
        "tools": tools,
    }
