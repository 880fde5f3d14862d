"""Turns every error into the one JSON shape: {"error": {"code", "message", "details"?}}."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from agentpark.errors import AgentparkError

__all__ = ["install_error_handlers"]

log = logging.getLogger(__name__)

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(AgentparkError)
    async def on_agentpark_error(_request: Request, exc: AgentparkError) -> JSONResponse:
        if exc.status >= 500 and exc.status != 507 and exc.status != 503:
            log.error("%s: %s", exc.code, exc.message)
        return JSONResponse(exc.to_body(), status_code=exc.status)

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
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        body = {"error": {"code": code, "message": str(exc.detail)}}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def on_unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        body = {"error": {"code": "internal_error", "message": f"{type(exc).__name__}: {exc}"}}
        return JSONResponse(body, status_code=500)


def _clean(error: Any) -> dict[str, Any]:
    """Keep what a client can act on; drop pydantic's URLs and raw context objects."""
    return {
        "loc": list(error.get("loc", ())),
        "msg": str(error.get("msg", "")),
        "type": str(error.get("type", "")),
    }
