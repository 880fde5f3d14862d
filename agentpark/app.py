"""create_app(settings): the FastAPI application of one daemon."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from agentpark import __version__
from agentpark.api import admin, dashboard, host, metrics, sessions
from agentpark.api.handlers import install_error_handlers
from agentpark.config import Settings
from agentpark.runtime import Runtime

__all__ = ["create_app"]


def create_app(settings: Settings) -> FastAPI:
    """Build the app; its lifespan starts the runtime and warms the engine in the background.

    Whoever runs the server may set ``app.state.request_shutdown`` (a callable) so that
    ``POST /v1/admin/drain`` can stop it once the sessions are safe.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = Runtime.start(settings)
        app.state.runtime = runtime
        warm = threading.Thread(target=runtime.warm_up, name="agentpark-warmup", daemon=True)
        warm.start()
        runtime.sampler.start()
        try:
            yield
        finally:
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
    app.include_router(sessions.router)
    app.include_router(host.router)
    app.include_router(admin.router)
    app.include_router(metrics.router)
    app.include_router(dashboard.router)
    return app
