"""Turns every error into the one JSON shape: {"error": {"code", "message", "details"?}}.

Also the request body limit (``limits.max_body_bytes``): a pure ASGI middleware that
answers 413 in that shape before any route sees the body (the refused body is read and
dropped, bounded, then the connection closed, so a client that writes its whole body
before reading, urllib, reads the 413 rather than a reset); and ``OPTIONS`` on any route
path, answered 204 with an ``Allow`` header naming every method of that path (Starlette
names only those of the first route that matched, so ``/v1/sessions/{id}`` said ``GET``
without ``DELETE``); a 405 carries the same ``Allow``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentpark.errors import AgentparkError, PayloadTooLargeError

__all__ = ["AllowMiddleware", "BodyLimitMiddleware", "allowed_methods", "install_error_handlers"]

log = logging.getLogger(__name__)

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(AgentparkError)
    async def on_agentpark_error(_request: Request, exc: AgentparkError) -> JSONResponse:
        if exc.status >= 500 and exc.status != 507 and exc.status != 503:
            log.error("%s: %s", exc.code, exc.message)
        return JSONResponse(exc.to_body(), status_code=exc.status, headers=exc.headers or None)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [_clean(e) for e in exc.errors()]
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"])
        message = f"{where}: {first['msg']}" if where else first["msg"]
        body = {"error": {"code": "invalid_request", "message": message, "details": errors}}
        return JSONResponse(body, status_code=422)

    @app.exception_handler(HTTPException)
    async def on_http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        unreadable = _unreadable_body(exc)
        if unreadable is not None:
            body = {"error": {"code": "invalid_request", "message": unreadable}}
            return JSONResponse(body, status_code=422)
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        body = {"error": {"code": code, "message": str(exc.detail)}}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def on_unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        body = {"error": {"code": "internal_error", "message": f"{type(exc).__name__}: {exc}"}}
        return JSONResponse(body, status_code=500)


def allowed_methods(routes: Iterable[BaseRoute], scope: Scope) -> list[str]:
    """Every method ``routes`` answer on this request's path, with OPTIONS; [] if none."""
    methods: set[str] = set()
    for route in routes:
        if not isinstance(route, Route) or not route.methods:
            continue
        match, _ = route.matches(scope)
        if match != Match.NONE:  # PARTIAL: the path matches, the method does not
            methods.update(route.methods)
    if not methods:
        return []
    return sorted(methods | {"OPTIONS"})


class AllowMiddleware:
    """``Allow`` names every method of a route path, whichever route the methods are on.

    ``OPTIONS`` on a route path is answered 204 with it; a 405 gets it in place of
    Starlette's (which names only the first matching route's). A path no route has
    falls through to the app (its JSON 404). ``routes`` gives the routes at request time.
    """

    def __init__(self, inner: ASGIApp, routes: Callable[[], Iterable[BaseRoute]]) -> None:
        self.inner = inner
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        if scope["method"] == "OPTIONS":
            methods = allowed_methods(self.routes(), scope)
            if methods:
                response = Response(status_code=204, headers={"Allow": ", ".join(methods)})
                await response(scope, receive, send)
                return

        async def send_allow(message: Message) -> None:
            # Only a 405 pays for matching the path against every route.
            if message["type"] == "http.response.start" and message["status"] == 405:
                methods = allowed_methods(self.routes(), scope)
                if methods:
                    headers = [
                        (k, v) for k, v in message.get("headers", []) if k.lower() != b"allow"
                    ]
                    headers.append((b"allow", ", ".join(methods).encode()))
                    message = {**message, "headers": headers}
            await send(message)

        await self.inner(scope, receive, send_allow)


def _unreadable_body(exc: HTTPException) -> str | None:
    """Why FastAPI could not decode a JSON body (its 400), as a 422 message; else None.

    FastAPI turns a decode failure other than bad JSON syntax into a 400 raised from the
    cause: bytes that are not UTF-8, or nesting deeper than the decoder recurses.
    """
    if exc.status_code != 400:
        return None
    cause = exc.__cause__
    if isinstance(cause, UnicodeDecodeError):
        return f"the body is not valid UTF-8 (byte {cause.start})"
    if isinstance(cause, RecursionError):
        return "the body is JSON nested too deeply to decode"
    if cause is not None:
        return f"the body could not be decoded as JSON ({type(cause).__name__})"
    return None


# A refused body is read and dropped up to this much, for at most this long (about 20 ms
# for 64 MiB on loopback); past either the 413 goes out and the connection is closed with
# the rest unread, which a client still writing may see as a reset.
DRAIN_MAX_BYTES = 64 * 2**20
DRAIN_MAX_S = 10.0


class BodyLimitMiddleware:
    """Refuse a request whose body is over ``max_bytes`` with 413 ``payload_too_large``.

    A declared Content-Length over the limit is refused without handing the body on; a
    body without one (chunked) is read up to the limit and refused as soon as it passes
    it. Either way the rest of the body is drained (:data:`DRAIN_MAX_BYTES`,
    :data:`DRAIN_MAX_S`) before the 413 is sent with ``Connection: close``: a server that
    closes with unread bytes in its socket makes the kernel send a reset, and a client
    still writing (urllib writes the whole body before it reads) then loses the answer.
    A body within the limit is buffered and handed on unchanged, so nothing downstream
    (a route, the store) ever sees a refused request.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(receive, send, more=True)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([], message), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            more = bool(message.get("more_body", False))
            if size > self.max_bytes:
                await self._refuse(receive, send, more=more)
                return
            chunks.append(chunk)
            if not more:
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], None, receive), send)

    async def _refuse(self, receive: Receive, send: Send, *, more: bool) -> None:
        if more:
            with anyio.move_on_after(DRAIN_MAX_S):
                await _drain(receive, DRAIN_MAX_BYTES)
        error = PayloadTooLargeError(
            f"the request body is over limits.max_body_bytes ({self.max_bytes} bytes)",
            max_body_bytes=self.max_bytes,
        )
        response = JSONResponse(
            error.to_body(), status_code=error.status, headers={"Connection": "close"}
        )
        await response({"type": "http"}, _nothing, send)


async def _drain(receive: Receive, limit: int) -> None:
    """Read and drop the rest of a request body, at most ``limit`` bytes of it."""
    size = 0
    while size <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


async def _nothing() -> Message:
    return {"type": "http.disconnect"}


def _replay(messages: list[Message], last: Message | None, then: Receive | None = None) -> Receive:
    """A receive that gives ``messages``, then ``last`` (or whatever ``then`` gives)."""
    queue = list(messages)

    async def receive() -> Message:
        if queue:
            return queue.pop(0)
        if last is not None:
            return last
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


def _clean(error: Any) -> dict[str, Any]:
    """Keep what a client can act on; drop pydantic's URLs and raw context objects."""
    return {
        "loc": list(error.get("loc", ())),
        "msg": str(error.get("msg", "")),
        "type": str(error.get("type", "")),
    }
