"""``Server-Timing: app;dur=<ms>`` on every HTTP answer: the daemon's own share of a request.

From the moment the app gets the request to the moment it starts the answer (a JSON
answer is complete by then), in milliseconds. A client subtracts it from what it saw to
tell the daemon's time from its own and the network's (``agentpark bench control``
prints both; browsers' developer tools show it). A pure ASGI middleware: two clock reads
and one header, no body buffering.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["SERVER_TIMING", "ServerTimingMiddleware", "app_ms"]

SERVER_TIMING = "server-timing"
_HEADER = SERVER_TIMING.encode()


class ServerTimingMiddleware:
    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        started = time.perf_counter()

        async def send_timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                ms = (time.perf_counter() - started) * 1e3
                headers = [*message.get("headers", []), (_HEADER, b"app;dur=%.3f" % ms)]
                message = {**message, "headers": headers}
            await send(message)

        await self.inner(scope, receive, send_timed)


def app_ms(header: str | None) -> float | None:
    """The ``app`` duration of a Server-Timing header value; None when it has none."""
    for metric in (header or "").split(","):
        name, _, params = metric.strip().partition(";")
        if name.strip() != "app":
            continue
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur":
                try:
                    return float(value)
                except ValueError:
                    return None
    return None
