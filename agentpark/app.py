"""create_app(settings): the FastAPI application of one daemon."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI

from agentpark import __version__
from agentpark.api import admin, dashboard, host, metrics, sessions, vllm
from agentpark.api.handlers import AllowMiddleware, BodyLimitMiddleware, install_error_handlers
from agentpark.config import Settings
from agentpark.errors import AgentparkError
from agentpark.runtime import Runtime
from agentpark.statedir import StateLock

__all__ = ["create_app"]

log = logging.getLogger(__name__)


def _reload_on_sighup(runtime: Runtime) -> bool:
    """SIGHUP reloads the policy; only where the loop may own signals (the main thread)."""

    def reload() -> None:
        try:
            runtime.reload_policy()
        except AgentparkError as exc:
            log.error("SIGHUP: %s", exc.message)

    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
    except (RuntimeError, ValueError, NotImplementedError):
        return False  # a server in a thread (tests): POST /v1/admin/reload still works
    return True


def create_app(
    settings: Settings, config_path: Path | None = None, *, state_lock: StateLock | None = None
) -> FastAPI:
    """Build the app; its lifespan starts the runtime and warms the engine in the background.

    Whoever runs the server may set ``app.state.request_shutdown`` (a callable) so that
    ``POST /v1/admin/drain`` can stop it once the sessions are safe. ``config_path`` is
    the file SIGHUP and ``POST /v1/admin/reload`` read the policy from again.
    ``state_lock``: the state dir's lock, if the caller took it already (the runtime then
    owns it); otherwise the lifespan's ``Runtime.start`` takes it.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = Runtime.start(settings, config_path, state_lock=state_lock)
        app.state.runtime = runtime
        warm = threading.Thread(target=runtime.warm_up, name="agentpark-warmup", daemon=True)
        warm.start()
        runtime.sampler.start()
        hup = _reload_on_sighup(runtime)
        try:
            yield
        finally:
            if hup:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            runtime.sampler.stop()
            warm.join()
            runtime.shutdown()

    app = FastAPI(
        title="agentpark",
        version=__version__,
        summary="Parks idle agents' KV cache off the accelerator and restores it bit-exact.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.limits.max_body_bytes)
    routers = (
        sessions.router,
        host.router,
        admin.router,
        metrics.router,
        dashboard.router,
        vllm.router,
    )
    for router in routers:
        app.include_router(router)
    # The routes themselves, read from the routers (not app.router.routes, which newer
    # FastAPI nests), for OPTIONS and the Allow header of a 405.
    app.add_middleware(
        AllowMiddleware,
        routes=lambda: [*app.router.routes, *(r for router in routers for r in router.routes)],
    )
    return app
