"""The error envelope on the wire and its OpenAPI table: the HTTP face of :mod:`agentpark.errors`.

The error classes live on the bottom floor and know only their status number and code;
this module, in the API layer, gives them a body model (:class:`ErrorBody`) and documents
them per route (:func:`error_responses`), so nothing below the API imports a wire model.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from pydantic import BaseModel, Field

from agentpark.errors import AgentparkError

__all__ = ["ErrorBody", "ErrorInfo", "ValidationFailure", "error_responses"]


class ValidationFailure(BaseModel):
    """One failure of request validation (``details`` of a 422 from the request schema)."""

    loc: list[str | int] = Field(description="where: body, query, path or header, then names")
    msg: str
    type: str = Field(description="pydantic's error type, e.g. missing, int_parsing")


class ErrorInfo(BaseModel):
    code: str = Field(description="stable and machine-readable; see the codes of each status")
    message: str = Field(description="for a human; the wording may change")
    details: dict[str, Any] | list[ValidationFailure] | None = Field(
        None,
        description="absent when there is nothing to add; what the error concerns (the "
        "session, the limit, the numbers); for a request that fails the schema, the list of "
        "failures",
    )


class ErrorBody(BaseModel):
    """The body of every error answer: ``{"error": {"code", "message", "details"?}}``."""

    error: ErrorInfo


def _summary(cls: type[AgentparkError]) -> str:
    doc = cls.__dict__.get("__doc__") or ""
    return doc.strip().splitlines()[0].rstrip(".") if doc.strip() else cls.__name__


def error_responses(*classes: type[AgentparkError]) -> dict[int | str, dict[str, Any]]:
    """FastAPI's ``responses=`` for a route that can raise ``classes``.

    One entry per HTTP status (each class's ``status``), with :class:`ErrorBody` as the
    schema, a description listing the codes of the classes that share the status, and one
    example per code. A class that is never served (:class:`ConfigError`) is refused.
    """
    groups: dict[int, list[type[AgentparkError]]] = {}
    for cls in classes:
        if not cls.served:
            raise ValueError(f"{cls.__name__} is never served; no route can answer with it")
        group = groups.setdefault(cls.status, [])
        if cls not in group:
            group.append(cls)
    responses: dict[int | str, dict[str, Any]] = {}
    for status in sorted(groups):
        group = groups[status]
        codes = "; ".join(f"`{c.code}`: {_summary(c)}" for c in group)
        examples = {
            c.code: {
                "summary": _summary(c),
                "value": {"error": {"code": c.code, "message": _summary(c)}},
            }
            for c in group
        }
        responses[status] = {
            "model": ErrorBody,
            "description": f"{HTTPStatus(status).phrase}. Codes: {codes}.",
            "content": {"application/json": {"examples": examples}},
        }
    return responses
