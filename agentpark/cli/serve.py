"""``agentpark serve``: run the daemon under uvicorn, one per state dir, and never on a
non-loopback address without a token."""

from __future__ import annotations

import argparse
import socket
import sys
from typing import TYPE_CHECKING, Any

from agentpark.cli.common import Commands, Subparsers, env_config, settings_of
from agentpark.cli.tokens import token_store
from agentpark.config import Settings

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

__all__ = [
    "add_serve_command",
    "daemon_server",
    "run_serve",
    "tokens_allow_bind",
    "uvicorn_config",
]


def add_serve_command(commands: Commands, sub: Subparsers[argparse.ArgumentParser]) -> None:
    serve = commands.add(sub, "serve", help="run the daemon (migrates the database first)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, help="bind port (default 8470; 0 picks one)")
    serve.add_argument(
        "--tier-files",
        choices=("refuse", "adopt", "discard"),
        help="tier files with data next to a database that knows no session: refuse to "
        "start (default), adopt them (every slot free) or discard them (moved aside); "
        "overrides reliability.tier_files",
    )
    serve.set_defaults(run=run_serve)


def _port(text: str) -> int:
    """``--port``: 0..65535 (0 picks a free one). Named so: argparse's message names it."""
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0..65535")
    return port


def uvicorn_config(app: Any, settings: Settings) -> uvicorn.Config:
    """The uvicorn config ``agentpark serve`` runs ``app`` with (``[server]`` settings)."""
    import uvicorn

    server = settings.server
    config = uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        log_level=settings.log_level,
        # Longer than the idle time of clients' connection pools, so a client never reuses
        # a connection uvicorn is closing (its default, 5 s, is below most of them).
        timeout_keep_alive=server.keep_alive_s,
    )
    # Leave room for the drain: uvicorn first waits this long for requests in flight.
    config.timeout_graceful_shutdown = 10
    return config


def daemon_server(config: uvicorn.Config, app: FastAPI) -> uvicorn.Server:
    """A uvicorn server for ``app`` (create_app's, ``config``'s too) that ends its event
    streams as its shutdown begins: uvicorn waits for open responses before the
    lifespan ends, and a stream only ends when told (agentpark.app.end_streams)."""
    import uvicorn

    from agentpark.app import end_streams

    class _Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            end_streams(app)
            await super().shutdown(sockets)

    return _Server(config)


def run_serve(args: argparse.Namespace) -> int:
    from agentpark.app import create_app
    from agentpark.dma import select_transfer
    from agentpark.statedir import StateLock

    settings = settings_of(args)
    server = settings.server.model_copy(
        update={k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    )
    settings = settings.model_copy(update={"server": server})
    if args.tier_files is not None:
        reliability = settings.reliability.model_copy(update={"tier_files": args.tier_files})
        settings = settings.model_copy(update={"reliability": reliability})
    if settings.dma.backend != "tpu_sync":  # tpu_sync is checked when the engine exists
        select_transfer(settings.dma.backend)  # refuse what this host cannot run, before binding
    # One daemon per state dir: a second one stops here, naming the holder's pid, before
    # it binds the port. The runtime owns the lock from its start and drops it at shutdown.
    lock = StateLock.acquire(settings.state_dir)
    try:
        if not tokens_allow_bind(settings):
            return 2
        app = create_app(settings, args.config or env_config(), state_lock=lock)
        config = uvicorn_config(app, settings)
        daemon = daemon_server(config, app)
        app.state.request_shutdown = lambda: setattr(daemon, "should_exit", True)
        # What start-up made lives as long as the daemon: out of the GC once warm (the
        # app's warm-up freezes it; agentpark.app.freeze_heap says why).
        app.state.freeze_heap = True
        try:
            daemon.run()  # uvicorn exits (SystemExit 3) when the lifespan fails to start
        except SystemExit:
            if getattr(app.state, "startup_error", None) is None:
                raise
        error = getattr(app.state, "startup_error", None)
        if error is not None:
            raise error  # main() prints it and exits 2
    finally:
        lock.release()  # idempotent; a startup that failed leaves it to this
    return 0


def tokens_allow_bind(settings: Settings) -> bool:
    """A non-loopback bind needs a token in the database: anyone could act as any tenant."""
    from agentpark.auth import is_loopback

    host = settings.server.host
    if is_loopback(host):
        return True
    with token_store(settings) as store:
        if store.active_count():
            return True
    print(
        f"agentpark: refusing to serve on {host}:{settings.server.port} without a token: "
        "anyone who can reach it could act as any tenant and stop the daemon. Make one "
        "first (the daemon need not run):\n"
        "  agentpark [--config FILE] token create --tenant NAME --scope sessions\n"
        "or import them (agentpark token import FILE), or bind 127.0.0.1.",
        file=sys.stderr,
    )
    return False
