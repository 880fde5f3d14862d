"""The error table: one HTTP status and one unique code per class, and its OpenAPI entries."""

from __future__ import annotations

from http import HTTPStatus

import pytest

import agentpark.errors as errors
from agentpark.api.errors_wire import ErrorBody, error_responses
from agentpark.errors import (
    AgentparkError,
    ConfigError,
    InvalidRequestError,
    InvalidStateError,
    LimitExceededError,
    PoolFullError,
    SessionBusyError,
    SessionNotFoundError,
    TierFullError,
    TransferError,
)


def _all_classes() -> list[type[AgentparkError]]:
    """AgentparkError and every subclass of it loaded, wherever it is defined."""
    found: list[type[AgentparkError]] = [AgentparkError]
    stack = [AgentparkError]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                stack.append(sub)
    return found


CLASSES = _all_classes()
SERVED = [c for c in CLASSES if c.served]


def test_the_walk_finds_every_exported_error() -> None:
    exported = {
        getattr(errors, name)
        for name in errors.__all__
        if isinstance(getattr(errors, name), type)
        and issubclass(getattr(errors, name), AgentparkError)
    }
    assert exported <= set(CLASSES)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_each_class_maps_to_exactly_one_status(cls: type[AgentparkError]) -> None:
    assert isinstance(cls.status, int) and HTTPStatus(cls.status)
    assert 400 <= cls.status <= 599
    assert isinstance(cls.code, str) and cls.code.isidentifier() and cls.code.islower()
    # A family shares its status: catching NotFoundError means 404, whatever the subclass.
    family = [b for b in cls.__mro__[1:] if issubclass(b, AgentparkError)]
    if len(family) > 1:  # below a direct subclass of AgentparkError
        assert cls.status == family[0].status, f"{cls.__name__} changes its family's status"
    if cls.served:
        (status,) = error_responses(cls)
        assert status == cls.status


def test_codes_are_unique() -> None:
    codes = [c.code for c in CLASSES]
    assert len(codes) == len(set(codes)), sorted(codes)


def test_an_instance_answers_its_class_status_and_code() -> None:
    exc = SessionBusyError("s", "pause", "resume")
    body = ErrorBody.model_validate(exc.to_body())
    assert (exc.status, body.error.code) == (409, "session_busy")
    assert body.error.details == {"session_id": "s", "operation": "pause", "in_flight": "resume"}
    bare = InvalidRequestError("no details").to_body()
    assert "details" not in bare["error"] and ErrorBody.model_validate(bare).error.details is None


def test_config_error_is_never_served() -> None:
    # Its status is the base's 500, documented as never sent: it stops the daemon at start.
    assert ConfigError.status == 500 and not ConfigError.served
    assert [c for c in CLASSES if not c.served] == [ConfigError]
    with pytest.raises(ValueError, match="never served"):
        error_responses(ConfigError)
    with pytest.raises(ValueError, match="never served"):
        error_responses(InvalidRequestError, ConfigError)


def test_error_responses_groups_classes_by_status() -> None:
    responses = error_responses(
        TierFullError,
        SessionNotFoundError,
        SessionBusyError,
        InvalidStateError,
        PoolFullError,
        SessionBusyError,  # twice: listed once
        TransferError,
        InvalidRequestError,
        LimitExceededError,
    )
    assert list(responses) == [404, 409, 422, 500, 507]  # one entry per status, in order
    codes = {
        status: list(entry["content"]["application/json"]["examples"])
        for status, entry in responses.items()
    }
    assert codes == {
        404: ["session_not_found"],
        409: ["session_busy", "invalid_state"],
        422: ["invalid_request", "limit_exceeded"],
        500: ["transfer_failed"],
        507: ["tier_full", "pool_full"],
    }
    for status, entry in responses.items():
        assert entry["model"] is ErrorBody
        assert entry["description"].startswith(HTTPStatus(int(status)).phrase)
        for code in codes[status]:
            assert f"`{code}`" in entry["description"]
            example = entry["content"]["application/json"]["examples"][code]["value"]
            assert ErrorBody.model_validate(example).error.code == code
    assert "`pool_full`: The KV pool has too few free blocks" in responses[507]["description"]


def test_every_served_class_lands_in_exactly_one_group() -> None:
    responses = error_responses(*SERVED)
    for cls in SERVED:
        groups = [
            status
            for status, entry in responses.items()
            if cls.code in entry["content"]["application/json"]["examples"]
        ]
        assert groups == [cls.status], cls.__name__
    assert error_responses() == {}


def test_each_call_builds_fresh_entries() -> None:
    # FastAPI writes the schema into a route's entry; routes must not share one.
    first, second = error_responses(PoolFullError), error_responses(PoolFullError)
    assert first == second and first[507]["content"] is not second[507]["content"]
