"""A real agentpark daemon for benchmarks: uvicorn on 127.0.0.1, in a thread of this process.

The same app ``agentpark serve`` runs, reached over real HTTP on a loopback port; running it
in-process lets every daemon of one bench share the engine's compiled steps (JAX caches
them per process), so no daemon pays a compile inside a measured run.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass

import httpx
import uvicorn
from fastapi import FastAPI

from agentpark.app import create_app
from agentpark.config import Settings
from agentpark.runtime import Runtime

__all__ = ["ThreadDaemon"]


@dataclass
class ThreadDaemon:
    """One daemon on a free loopback port; :meth:`start` returns once it is ready."""

    settings: Settings
    url: str
    app: FastAPI
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def runtime(self) -> Runtime:
        runtime: Runtime = self.app.state.runtime
        return runtime

    @classmethod
    def start(cls, settings: Settings, ready_timeout_s: float = 600.0) -> ThreadDaemon:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)  # connections queue here until uvicorn accepts them
        port = sock.getsockname()[1]
        app = create_app(settings, anonymous=True)  # bound to 127.0.0.1 above: no token needed
        config = uvicorn.Config(
            app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5
        )
        server = uvicorn.Server(config)
        app.state.request_shutdown = lambda: setattr(server, "should_exit", True)
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="agentpark-bench-daemon"
        )
        thread.daemon = True
        thread.start()
        daemon = cls(settings, f"http://127.0.0.1:{port}", app, server, thread)
        try:
            # Answered once the lifespan has run, so the runtime exists after this.
            with httpx.Client(base_url=daemon.url, timeout=ready_timeout_s) as client:
                client.get("/healthz").raise_for_status()
            if not daemon.runtime.ready.wait(timeout=ready_timeout_s):
                raise RuntimeError(f"the daemon was not ready within {ready_timeout_s:g}s")
        except BaseException:
            daemon.stop()
            raise
        return daemon  # uvicorn serves on ``sock`` and closes it when it stops

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=120)
        if self.thread.is_alive():
            raise RuntimeError("the bench daemon did not stop within 120s")
