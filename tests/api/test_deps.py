"""The hot routes' dependency trees stay one node deep (agentpark.api.deps says why).

FastAPI walks every node of a route's tree on every request, cached ones included; the
control plane's latency targets (``agentpark bench control``) were met only once the
session routes took one ``Caller``. A route that adds a second dependency fails here, to
be merged into the caller instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, iter_route_contexts

from agentpark.app import create_app
from agentpark.auth import Scope
from agentpark.config import load_settings
from tests.api.test_auth import OPEN, SCOPE
from tests.harness import Daemon

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
    assert len(hot) == 13, sorted(hot)
    for key, route in hot.items():
        assert _nodes(route.dependant) == MOST_NODES, key


@pytest.mark.parametrize("path", ["/v1/sessions/{session_id}", "/v1/host", "/healthz"])
def test_in_memory_reads_are_async_routes(tmp_path: Path, path: str) -> None:
    """No thread-pool hop for a dict lookup: the route runs on the event loop."""
    assert inspect.iscoroutinefunction(_routes(tmp_path)[("GET", path)].endpoint)


# ---- the spec as served: what the guards declare ------------------------------------------


def _guarded(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if (method.upper(), path) not in OPEN:
                yield method.upper(), path, operation


@pytest.mark.parametrize("anonymous", [True, False])
def test_no_route_declares_an_authorization_header_parameter(
    tmp_path: Path, anonymous: bool
) -> None:
    spec = create_app(load_settings(state_dir=tmp_path), anonymous=anonymous).openapi()
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            names = [p["name"].lower() for p in operation.get("parameters", [])]
            assert "authorization" not in names, (method, path)
    assert set(spec["components"]["securitySchemes"]) == {"bearer"}


def test_a_loopback_default_spec_makes_the_token_optional_where_it_serves_without(
    tmp_path: Path,
) -> None:
    spec = create_app(load_settings(state_dir=tmp_path), anonymous=True).openapi()
    for method, path, operation in _guarded(spec):
        if SCOPE[(method, path)] is Scope.ADMIN:
            assert operation["security"] == [{"bearer": []}], (method, path)
        else:
            assert operation["security"] == [{}, {"bearer": []}], (method, path)


def test_a_spec_of_a_daemon_that_needs_tokens_requires_them_everywhere(tmp_path: Path) -> None:
    spec = create_app(load_settings(state_dir=tmp_path), anonymous=False).openapi()
    for method, path, operation in _guarded(spec):
        assert operation["security"] == [{"bearer": []}], (method, path)


def test_the_served_spec_follows_the_running_mode(daemon: Daemon) -> None:
    def security() -> list[dict[str, list[str]]]:
        spec = daemon.client.get("/openapi.json").json()
        found: list[dict[str, list[str]]] = spec["paths"]["/v1/sessions"]["get"]["security"]
        return found

    assert security() == [{}, {"bearer": []}]  # loopback, no token yet
    daemon.admin()  # the first token: from now on every request needs one
    assert security() == [{"bearer": []}]


def test_the_served_spec_names_only_what_this_daemon_accepts(daemon: Daemon) -> None:
    schemas = daemon.client.get("/openapi.json").json()["components"]["schemas"]
    assert schemas["TierChoice"]["enum"] == ["auto", "dram", "shm"]  # no disk tier here
    assert schemas["MoveRequest"]["properties"]["tier"]["enum"] == ["dram", "shm"]
    generate = schemas["GenerateRequest"]["properties"]
    limits = daemon.settings.limits
    assert generate["max_new_tokens"]["maximum"] == limits.max_new_tokens
    array = next(o for o in generate["prompt_tokens"]["anyOf"] if o.get("type") == "array")
    engine = daemon.runtime.engine
    assert engine is not None
    assert array["items"] == {"type": "integer", "minimum": 0, "maximum": engine.vocab_size - 1}
