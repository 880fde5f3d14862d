"""GET /metrics: the Prometheus exposition of this daemon (see agentpark.metrics)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Response

from agentpark.api.deps import RuntimeDep

__all__ = ["router"]

router = APIRouter()


@router.get("/metrics", tags=["host"], response_class=Response)
def get_metrics(runtime: RuntimeDep, accept: Annotated[str | None, Header()] = None) -> Response:
    """Prometheus text format, or OpenMetrics when the scraper asks for it."""
    body, content_type = runtime.metrics.render(accept)
    return Response(content=body, media_type=content_type)
