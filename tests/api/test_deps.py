"""The hot routes' dependency trees stay one node deep (agentpark.api.deps says why).

FastAPI walks every node of a route's tree on every request, cached ones included; the
control plane's latency targets (``agentpark bench control``) were met only once the
session routes took one ``Caller``. A route that adds a second dependency fails here, to
be merged into the caller instead.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, iter_route_contexts

from agentpark.app import create_app
from agentpark.config import load_settings

HOT = ("/v1/sessions", "/v1/events", "/v1/host", "/v1/vllm")
# The caller and the HTTPBearer node under it (kept so OpenAPI lists the scheme).
MOST_NODES = 2


def _nodes(dependant: Dependant) -> int:
    return sum(1 + _nodes(sub) for sub in dependant.dependencies)


def _routes(tmp_path: Path) -> dict[tuple[str, str], APIRoute]:
    """(method, path) -> route, through included routers too."""
    app = create_app(load_settings(state_dir=tmp_path))
    found = {}
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        if isinstance(route, APIRoute):
            for method in route.methods:
                found[(method, context.path)] = route
    return found


def test_every_hot_route_solves_one_caller_and_nothing_else(tmp_path: Path) -> None:
    hot = {
        key: route
        for key, route in _routes(tmp_path).items()
        if any(key[1] == p or key[1].startswith(p + "/") for p in HOT)
        and not key[1].startswith("/v1/host/")  # the dashboard's views: not hot
    }
    assert len(hot) == 11, sorted(hot)
    for key, route in hot.items():
        assert _nodes(route.dependant) == MOST_NODES, key


@pytest.mark.parametrize("path", ["/v1/sessions/{session_id}", "/v1/host", "/healthz"])
def test_in_memory_reads_are_async_routes(tmp_path: Path, path: str) -> None:
    """No thread-pool hop for a dict lookup: the route runs on the event loop."""
    assert inspect.iscoroutinefunction(_routes(tmp_path)[("GET", path)].endpoint)
