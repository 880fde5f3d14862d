"""create_app(settings): the FastAPI application of one daemon."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from agentpark import __version__
from agentpark.api import (
    admin,
    dashboard,
    host,
    metrics,
    moves,
    sessions,
    stream,
    tokens,
    turns,
    vllm,
)
from agentpark.api.auth_limit import AuthLimiter
from agentpark.api.deps import SpecLimits, served_spec
from agentpark.api.handlers import AllowMiddleware, BodyLimitMiddleware, install_error_handlers
from agentpark.api.timing import ServerTimingMiddleware
from agentpark.auth import Gate, TokenStore, is_loopback
from agentpark.config import Settings
from agentpark.errors import AgentparkError, ConfigError
from agentpark.eventstream import EventHub
from agentpark.moving import MoveService
from agentpark.runtime import Runtime
from agentpark.statedir import StateLock

__all__ = ["create_app", "end_streams", "freeze_heap"]

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


def _warm_up(app: FastAPI, runtime: Runtime) -> None:
    """The runtime's warm-up; then, where the server asked for it (``agentpark serve``
    sets ``app.state.freeze_heap``), everything made so far is frozen out of the GC."""
    runtime.warm_up()
    if getattr(app.state, "freeze_heap", False):
        freeze_heap()


def freeze_heap() -> None:
    """Move every object alive now out of the garbage collector's reach for good.

    A full collection walks every tracked object; in a daemon with 10,000 sessions each
    took 90-650 ms on the 2-core machine (freeing at most a few dozen objects) and landed
    in whichever request crossed the threshold. What start-up made (JAX, XLA's traced
    functions, FastAPI, SQLAlchemy: ~190,000 objects after the imports alone) lives as long
    as the daemon, so it is frozen: never walked again. Not for a process that builds
    and drops many apps (the tests): frozen garbage is never freed.
    """
    gc.collect()
    gc.freeze()


def create_app(
    settings: Settings,
    config_path: Path | None = None,
    *,
    state_lock: StateLock | None = None,
    anonymous: bool | None = None,
) -> FastAPI:
    """Build the app; its lifespan starts the runtime and warms the engine in the background.

    Whoever runs the server may set ``app.state.request_shutdown`` (a callable) so that
    ``POST /v1/admin/drain`` can stop it once the sessions are safe. ``config_path`` is
    the file SIGHUP and ``POST /v1/admin/reload`` read the policy from again.
    ``state_lock``: the state dir's lock, if the caller took it already (the runtime then
    owns it); otherwise the lifespan's ``Runtime.start`` takes it.

    ``anonymous``: whether the loopback default may apply (requests without a token run as
    tenant ``default`` with the sessions and operator scopes while the database holds no
    token; see agentpark.auth). None: when ``settings.server.host``, the address ``agentpark
    serve`` binds (its ``--host`` is in the settings), is a loopback address. An app served
    without a bind of its own (in-process ASGI clients in tests) says which it wants.
    """
    if anonymous is None:
        anonymous = is_loopback(settings.server.host)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            runtime = Runtime.start(settings, config_path, state_lock=state_lock)  # migrates
        except ConfigError as exc:  # `agentpark serve` prints it and exits 2
            app.state.startup_error = exc
            raise
        app.state.runtime = runtime
        caps = settings.limits
        app.state.streams = EventHub(
            caps.max_streams, caps.max_streams_per_tenant, caps.stream_queue_events
        )
        runtime.parking.add_listener(app.state.streams.publish)
        tokens = TokenStore.open(settings.database_url)
        app.state.gate = Gate(tokens, anonymous=anonymous)
        limits = settings.auth
        app.state.auth_limiter = AuthLimiter(
            limits.failure_burst,
            limits.failure_rate_per_s,
            limits.max_peers,
            count=runtime.metrics.count_auth_failure,
        )
        app.state.moves = MoveService.start(runtime)
        if runtime.vllm is not None:  # the control socket's hello checks tokens as REST does
            runtime.vllm.gate = app.state.gate
        warm = threading.Thread(
            target=_warm_up, args=(app, runtime), name="agentpark-warmup", daemon=True
        )
        warm.start()
        runtime.sampler.start()
        hup = _reload_on_sighup(runtime)
        try:
            yield
        finally:
            if hup:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            end_streams(app)
            runtime.sampler.stop()
            warm.join()
            app.state.moves.close()  # open imports give their reserved slots back
            try:
                runtime.shutdown()
            finally:
                tokens.close()

    app = FastAPI(
        title="agentpark",
        version=__version__,
        summary="Parks idle agents' KV cache off the accelerator and restores it bit-exact.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    _serve_the_spec_of_the_running_mode(app, anonymous)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.limits.max_body_bytes)
    routers = (
        sessions.router,
        turns.router,
        stream.router,
        host.router,
        admin.router,
        tokens.router,
        metrics.router,
        dashboard.router,
        vllm.router,
        moves.router,
    )
    for router in routers:
        app.include_router(router)
    # The routes themselves, read from the routers (not app.router.routes, which newer
    # FastAPI nests), for OPTIONS and the Allow header of a 405.
    app.add_middleware(
        AllowMiddleware,
        routes=lambda: [*app.router.routes, *(r for router in routers for r in router.routes)],
    )
    app.add_middleware(ServerTimingMiddleware)  # outermost of ours: it times them too
    return app


def end_streams(app: FastAPI) -> None:
    """End every event stream (``GET /v1/events/stream``): the daemon is stopping.

    Whoever runs the server calls it as its shutdown begins (uvicorn waits for open
    responses before the lifespan ends, and a stream never ends by itself); the lifespan
    calls it again, for servers that do not.
    """
    hub: EventHub | None = getattr(app.state, "streams", None)
    if hub is not None:
        hub.close()


def _serve_the_spec_of_the_running_mode(app: FastAPI, anonymous: bool) -> None:
    """``/openapi.json`` says whether a token is needed now: optional on the routes the
    loopback default serves while it does (see agentpark.api.deps.served_spec).

    Before the lifespan runs (``app.openapi()`` in tests, no gate yet), ``anonymous`` says,
    and the bodies' bounds are the models' own (no runtime to read the configuration from).
    """
    generate = app.openapi
    served: dict[tuple[int, bool, bool], dict[str, Any]] = {}

    def openapi() -> dict[str, Any]:
        generated = generate()  # FastAPI's own, cached until the routes change
        gate: Gate | None = getattr(app.state, "gate", None)
        open_now = gate.open_default() if gate is not None else anonymous
        runtime: Runtime | None = getattr(app.state, "runtime", None)
        key = (id(generated), open_now, runtime is not None)
        if key not in served:
            served.clear()  # routes changed, or the mode did: at most one copy kept
            limits = None if runtime is None else _spec_limits(runtime)
            served[key] = served_spec(generated, open_default=open_now, limits=limits)
        return served[key]

    app.openapi = openapi  # type: ignore[method-assign]


def _spec_limits(runtime: Runtime) -> SpecLimits:
    engine = runtime.engine
    return SpecLimits(
        tiers=tuple(runtime.parking.tiers),
        max_new_tokens=runtime.settings.limits.max_new_tokens,
        vocab_size=None if engine is None else engine.vocab_size,
    )
