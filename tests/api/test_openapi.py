"""The OpenAPI spec: every route declares what it answers and every error it can raise.

The spec is built from the app alone (``app.openapi()`` needs no lifespan, no engine).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from agentpark.api.errors_wire import ErrorBody
from agentpark.app import create_app
from agentpark.config import Settings
from tests.harness import Daemon

SESSION = "/v1/sessions/{session_id}"
BAD_REQUEST = {422: {"invalid_request"}}
# Routes that take a body: over limits.max_body_bytes (or metadata over its limit) is 413.
TOO_LARGE = {413: {"payload_too_large"}}
# What an engine operation on one session can answer, besides its 507 and 500.
OPERATION = {
    404: {"session_not_found"},
    409: {"session_busy", "invalid_state"},
    422: {"invalid_request"},
    503: {"not_ready", "storage_unavailable"},
}

# What every guarded route answers besides its own errors (tests/api/test_auth.py).
AUTH = {
    400: {"tenant_header_refused"},
    401: {"unauthenticated"},
    403: {"insufficient_scope"},
    429: {"auth_throttled"},
}
OPEN = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/dashboard"),
}

# A move asked of the source (agentpark.moving): the target's refusals come back as its own.
MOVE_OUT = {
    **TOO_LARGE,
    404: {"session_not_found"},
    409: {"session_busy", "invalid_state", "layout_mismatch"},
    422: {"invalid_request"},
    502: {"peer_failed"},
    503: {"storage_unavailable"},
    507: {"tier_full"},
}

# Per route: the error statuses it must document, and the codes each must list.
_OWN_ERRORS: dict[tuple[str, str], dict[int, set[str]]] = {
    ("POST", "/v1/sessions"): {
        **TOO_LARGE,
        409: {"session_exists"},
        422: {"invalid_request"},
        503: {"not_ready", "storage_unavailable"},
    },
    ("GET", "/v1/sessions"): BAD_REQUEST,
    ("GET", SESSION): {404: {"session_not_found"}, 422: {"invalid_request"}},
    ("DELETE", SESSION): {
        404: {"session_not_found"},
        409: {"session_busy", "invalid_state"},
        422: {"invalid_request"},
        503: {"storage_unavailable"},
    },
    ("POST", f"{SESSION}/generate"): {
        **OPERATION,
        **TOO_LARGE,
        409: {"session_busy", "invalid_state", "context_full"},
        422: {"invalid_request", "limit_exceeded"},
        507: {"pool_full"},
        500: {"transfer_failed"},
    },
    ("POST", f"{SESSION}/pause"): {
        **OPERATION,
        **TOO_LARGE,
        507: {"tier_full"},
        500: {"transfer_failed"},
    },
    ("POST", f"{SESSION}/resume"): {**OPERATION, 507: {"pool_full"}, 500: {"transfer_failed"}},
    ("POST", f"{SESSION}/move"): {
        **OPERATION,
        **TOO_LARGE,
        507: {"tier_full"},
        500: {"transfer_failed"},
    },
    ("GET", "/v1/events"): BAD_REQUEST,
    ("GET", "/v1/events/stream"): {
        422: {"invalid_request"},
        429: {"too_many_streams", "auth_throttled"},
        503: {"not_ready"},
    },
    ("GET", f"{SESSION}/turns"): {404: {"session_not_found"}, 422: {"invalid_request"}},
    ("GET", "/v1/requests/{request_id}"): {404: {"request_not_found"}, 422: {"invalid_request"}},
    ("GET", "/v1/host"): {},
    ("GET", "/v1/host/history"): BAD_REQUEST,
    ("GET", "/v1/host/latency"): BAD_REQUEST,
    ("GET", "/v1/host/parked"): BAD_REQUEST,
    ("GET", "/v1/peers"): BAD_REQUEST,
    ("GET", "/healthz"): {},
    ("GET", "/readyz"): {503: {"not_ready", "storage_unavailable"}},
    ("POST", "/v1/admin/drain"): {},
    ("POST", "/v1/admin/reload"): BAD_REQUEST,
    ("GET", "/v1/admin/policy"): {},
    ("GET", "/v1/admin/tokens"): {},
    ("POST", "/v1/admin/tokens"): {**TOO_LARGE, 422: {"invalid_request"}},
    ("DELETE", "/v1/admin/tokens/{token_id}"): {404: {"token_not_found"}, 422: {"invalid_request"}},
    ("GET", "/metrics"): BAD_REQUEST,
    ("GET", "/dashboard"): {},
    ("GET", "/v1/vllm"): {409: {"invalid_state"}},
    **{("POST", path): MOVE_OUT for path in ("/v1/moves", "/v1/moves/drain")},
    ("POST", "/v1/moves/in"): {
        **TOO_LARGE,
        409: {"session_exists", "layout_mismatch"},
        422: {"invalid_request"},
        503: {"not_ready"},
        507: {"tier_full"},
    },
    ("PUT", "/v1/moves/in/{move_id}/blocks"): {**TOO_LARGE, 422: {"invalid_request"}},
    ("POST", "/v1/moves/in/{move_id}/commit"): {
        409: {"session_exists"},
        422: {"invalid_request"},
        503: {"storage_unavailable"},
    },
    ("DELETE", "/v1/moves/in/{move_id}"): BAD_REQUEST,
    ("POST", "/v1/moves/in-batch"): {**TOO_LARGE, 422: {"invalid_request"}},
    ("POST", "/v1/moves/in-batch/commit"): {
        422: {"invalid_request"},
        503: {"storage_unavailable"},
    },
}
REQUIRED_ERRORS = {
    key: errors if key in OPEN else {**errors, **AUTH} for key, errors in _OWN_ERRORS.items()
}

# Routes whose answer is text, not JSON.
TEXT_ROUTES = {("GET", "/metrics"), ("GET", "/dashboard"), ("GET", "/v1/events/stream")}
# Routes that answer with no body at all.
NO_CONTENT = {("DELETE", SESSION), ("DELETE", "/v1/moves/in/{move_id}")}
# Fields free-form by nature: what the caller stored, and an error's details.
FREE_FORM = {("SessionOut", "metadata"), ("ErrorInfo", "details")}
# Words a route function's name starts with (verb_noun).
VERBS = {"get", "list", "create", "delete", "generate", "pause", "resume", "move", "drain"}
VERBS |= {"reload"}
# Annotation keys that say nothing about a value's type.
ANNOTATIONS = {"title", "description", "default", "examples", "deprecated"}


@pytest.fixture
def app(make_settings: Callable[..., Settings]) -> FastAPI:
    return create_app(make_settings())


@pytest.fixture
def spec(app: FastAPI) -> dict[str, Any]:
    spec: dict[str, Any] = app.openapi()
    return spec


def _operations(spec: dict[str, Any]) -> Iterator[tuple[tuple[str, str], dict[str, Any]]]:
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            yield (method.upper(), path), operation


def _resolve(spec: dict[str, Any], ref: str) -> tuple[str, dict[str, Any]]:
    name = ref.removeprefix("#/components/schemas/")
    schema: dict[str, Any] = spec["components"]["schemas"][name]
    return name, schema


def _untyped(
    spec: dict[str, Any], node: dict[str, Any], where: tuple[str, str], seen: set[str]
) -> Iterator[tuple[str, str]]:
    """Every place under ``node`` whose value is Any or an object of anything."""
    if "$ref" in node:
        name, schema = _resolve(spec, node["$ref"])
        if name not in seen:
            yield from _untyped(spec, schema, (name, ""), seen | {name})
        return
    if not set(node) - ANNOTATIONS:
        yield where  # {}: any value at all
        return
    extra = node.get("additionalProperties")
    if node.get("type") == "object" and "properties" not in node and extra in (None, True, {}):
        yield where
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for option in node.get(key, []):
            yield from _untyped(spec, option, where, seen)
    for name, field in node.get("properties", {}).items():
        yield from _untyped(spec, field, (where[0], name), seen)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _untyped(spec, node[key], where, seen)


def test_the_table_names_every_route(spec: dict[str, Any]) -> None:
    assert {key for key, _ in _operations(spec)} == set(REQUIRED_ERRORS)


def test_every_route_declares_a_typed_answer(spec: dict[str, Any]) -> None:
    for key, operation in _operations(spec):
        ok = {s: r for s, r in operation["responses"].items() if s.startswith("2")}
        assert ok, f"{key}: no 2xx answer"
        if key in NO_CONTENT:
            assert all("content" not in r for r in ok.values()), key
            continue
        if key in TEXT_ROUTES:
            for answer in ok.values():
                assert answer["content"] and "application/json" not in answer["content"], key
            continue
        for status, answer in ok.items():
            schema = answer["content"]["application/json"]["schema"]
            assert "$ref" in schema, f"{key} {status}: not a declared model: {schema}"
            _, model = _resolve(spec, schema["$ref"])
            assert model.get("properties"), f"{key} {status}: a model with no fields"
            loose = set(_untyped(spec, schema, ("", ""), set())) - FREE_FORM
            assert not loose, f"{key} {status}: untyped parts {sorted(loose)}"


@pytest.mark.parametrize(("key", "required"), sorted(REQUIRED_ERRORS.items()))
def test_every_route_documents_the_errors_it_can_raise(
    spec: dict[str, Any], key: tuple[str, str], required: dict[int, set[str]]
) -> None:
    method, path = key
    responses = spec["paths"][path][method.lower()]["responses"]
    errors = {int(s): r for s, r in responses.items() if s[0] in "45"}
    assert set(errors) == set(required), f"{key}: documents {sorted(errors)}"
    for status, codes in required.items():
        answer = errors[status]
        content = answer["content"]["application/json"]
        assert content["schema"] == {"$ref": "#/components/schemas/ErrorBody"}, (key, status)
        listed = set(content["examples"])
        assert codes <= listed, f"{key} {status}: lists {sorted(listed)}, needs {sorted(codes)}"
        for code in listed:
            assert f"`{code}`" in answer["description"], (key, status, code)
            assert content["examples"][code]["value"]["error"]["code"] == code


def test_validation_errors_are_documented_as_our_envelope(spec: dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    envelope = schemas["ErrorBody"]
    assert envelope["required"] == ["error"]
    _, info = _resolve(spec, envelope["properties"]["error"]["$ref"])
    assert set(info["required"]) == {"code", "message"}
    assert set(info["properties"]) == {"code", "message", "details"}
    for key, operation in _operations(spec):
        if "422" in operation["responses"]:
            schema = operation["responses"]["422"]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorBody"}, key


def test_no_route_documents_an_error_that_is_never_served(spec: dict[str, Any]) -> None:
    for key, operation in _operations(spec):
        for status, answer in operation["responses"].items():
            examples = answer.get("content", {}).get("application/json", {}).get("examples", {})
            assert "config_error" not in examples, (key, status)


def test_route_functions_are_named_verb_noun(app: FastAPI) -> None:
    for route in app.routes:
        if isinstance(route, APIRoute):
            verb, _, noun = route.name.partition("_")
            assert verb in VERBS and noun, f"{route.path}: {route.name}"


def test_real_error_answers_validate_as_the_documented_body(daemon: Daemon) -> None:
    c = daemon.client
    answers = {
        "session_not_found": c.get("/v1/sessions/nope"),
        "invalid_request": c.post("/v1/sessions/nope/generate", json={"max_new_tokens": "x"}),
    }
    c.post("/v1/sessions", json={"session_id": "s"})
    answers["invalid_state"] = c.post("/v1/sessions/s/move", json={"tier": "shm"})
    for code, answer in answers.items():
        body = ErrorBody.model_validate(answer.json())
        assert body.error.code == code, answer.text
    details = ErrorBody.model_validate(answers["invalid_request"].json()).error.details
    assert isinstance(details, list) and details[0].loc == ["body", "max_new_tokens"]


@pytest.mark.parametrize(
    "module",
    [
        "agentpark/schemas/sessions.py",
        "agentpark/schemas/host.py",
        "agentpark/schemas/auth.py",
        "agentpark/api/errors_wire.py",
    ],
)
def test_wire_models_do_not_depend_on_the_store_or_the_core(module: str) -> None:
    tree = ast.parse((Path(__file__).parents[2] / module).read_text(encoding="utf-8"))
    imported: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported.append(node.module or "")
        elif isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
    assert "pydantic" in imported  # the walk sees the imports
    for name in imported:
        assert not name.startswith(("agentpark.store", "agentpark.parking", "sqlalchemy")), name
