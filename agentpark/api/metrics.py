"""GET /metrics: the Prometheus exposition of this daemon (see agentpark.metrics)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Response
from prometheus_client.exposition import choose_encoder

from agentpark.api.deps import RuntimeDep
from agentpark.api.errors_wire import error_responses
from agentpark.errors import InvalidRequestError

__all__ = ["router"]

router = APIRouter()


# The two formats the route answers with: what choose_encoder picks by default and when
# the scraper accepts OpenMetrics.
_FORMATS = (choose_encoder("")[1], choose_encoder("application/openmetrics-text")[1])
_EXPOSITION: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the exposition, in the format the Accept header asks for",
        "content": {media: {"schema": {"type": "string"}} for media in _FORMATS},
    }
}


@router.get(
    "/metrics",
    tags=["host"],
    response_class=Response,
    responses={**_EXPOSITION, **error_responses(InvalidRequestError)},
)
def get_metrics(runtime: RuntimeDep, accept: Annotated[str | None, Header()] = None) -> Response:
    """Prometheus text format, or OpenMetrics when the scraper asks for it."""
    body, content_type = runtime.metrics.render(accept)
    return Response(content=body, media_type=content_type)
