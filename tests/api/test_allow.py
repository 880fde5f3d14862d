"""OPTIONS and 405 name every method of a route path in ``Allow``."""

from __future__ import annotations

import pytest

from tests.harness import Daemon


def _allow(header: str) -> set[str]:
    return {m.strip() for m in header.split(",")}


def test_options_on_a_session_names_get_and_delete(daemon: Daemon) -> None:
    c = daemon.client
    assert c.post("/v1/sessions", json={"session_id": "o"}).status_code == 201
    response = c.options("/v1/sessions/o")
    assert response.status_code == 204
    assert _allow(response.headers["allow"]) == {"GET", "DELETE", "OPTIONS"}
    assert response.content == b""
    # FastAPI answers no HEAD for a GET route, and Allow does not claim it does.
    assert c.head("/v1/sessions/o").status_code == 405
    # The path is matched, not the session: one that does not exist has the same methods.
    assert _allow(c.options("/v1/sessions/nobody").headers["allow"]) == {
        "GET",
        "DELETE",
        "OPTIONS",
    }


@pytest.mark.parametrize(
    ("path", "methods"),
    [
        ("/v1/sessions", {"GET", "POST", "OPTIONS"}),
        ("/v1/sessions/o/pause", {"POST", "OPTIONS"}),
        ("/metrics", {"GET", "OPTIONS"}),
    ],
)
def test_options_names_every_method_of_the_path(
    daemon: Daemon, path: str, methods: set[str]
) -> None:
    response = daemon.client.options(path)
    assert response.status_code == 204
    assert _allow(response.headers["allow"]) == methods


def test_options_on_no_route_is_the_json_404(daemon: Daemon) -> None:
    response = daemon.client.options("/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_a_405_names_every_method_of_the_path_in_json(daemon: Daemon) -> None:
    response = daemon.client.put("/v1/sessions/o", json={})
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"
    assert _allow(response.headers["allow"]) == {"GET", "DELETE", "OPTIONS"}
