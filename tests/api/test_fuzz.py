"""Spec fuzzing: schemathesis over the app's own OpenAPI, every check, in-process ASGI.

Schemathesis generates requests from /openapi.json (valid ones, and invalid ones the
spec says must be refused) and checks each answer: no 5xx, the status and the body are
what the spec declares, invalid input is refused, valid input accepted, and so on (all of
its checks, none switched off). The cases are bounded (``MAX_EXAMPLES`` per operation)
so the test fits in about a minute. (Driven through hypothesis directly: schemathesis'
pytest plugin, ``from_fixture``, does not run on pytest 9.)

``POST /v1/admin/drain`` is left out: it parks everything and stops the daemon, by design,
which every later case would then see.

The same spec is then fuzzed by schemathesis' own command line (``st run --checks all``,
every phase: examples, coverage, fuzzing, stateful) against real uvicorn daemons: one on
loopback serving without a token (the spec then says the token is optional) and one with
tokens (the spec says they are required). Zero failures of any kind in both, with
``REAL_MAX_EXAMPLES`` cases per operation and a fixed seed, so the runs stay short.

Both send hundreds of missing and invalid tokens from one address, on purpose (each case
without its token, schemathesis' probes of the auth); the daemons' ``[auth]`` burst is
raised above that (``FUZZ_AUTH``), else the back-off answers them 429 as it should, where
the checks want the 401 each time (tests/api/test_auth_limit.py tests the back-off).

``auth_headers`` is the one place the credentials of the requests come from: a bearer
token of tenant ``fuzz`` with the ``sessions`` and ``operator`` scopes (no ``admin``: the
admin routes answer 401/403 to it, which the spec documents).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import BaseSchema, Case, GenerationMode
from schemathesis.python.asgi import shutdown_lifespans

from agentpark.app import create_app
from agentpark.config import Settings
from tests.harness import (
    Daemon,
    bearer,
    make_token,
    private_shm_dir,
    tiny_settings,
    unset_agentpark_env,
)

MAX_EXAMPLES = 25
REAL_MAX_EXAMPLES = 6
FUZZ_AUTH = {"failure_burst": 1_000_000}


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    """A daemon app of its own; schemathesis runs its lifespan (start, warm-up, shutdown)."""
    with pytest.MonkeyPatch.context() as env, private_shm_dir() as shm:
        unset_agentpark_env(env)
        settings = tiny_settings(tmp_path_factory.mktemp("fuzz") / "state", shm, auth=FUZZ_AUTH)
        app = create_app(settings, anonymous=False)  # every request needs its token
        yield app
        shutdown_lifespans()  # the runtime stops, drains into the private shm dir, lets go


@pytest.fixture(scope="module")
def fuzz_schema(fuzz_app: FastAPI) -> BaseSchema:
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)
    assert fuzz_app.state.runtime.ready.wait(timeout=120), "engine warm-up did not finish"
    # The event stream follows until the client leaves: tests/api/test_turns_stream.py.
    return schema.exclude(method="POST", path="/v1/admin/drain").exclude(
        method="GET", path="/v1/events/stream"
    )


@pytest.fixture(scope="module")
def auth_headers(fuzz_schema: BaseSchema, fuzz_app: FastAPI) -> dict[str, str]:
    """Headers every fuzzed request carries: a token made once the app runs."""
    return bearer(make_token(fuzz_app, "fuzz", "sessions,operator"))


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_api_answers_every_case_as_its_spec_says(
    fuzz_app: FastAPI,
    fuzz_schema: BaseSchema,
    auth_headers: dict[str, str],
    mode: GenerationMode,
) -> None:
    """Each operation in turn, with valid (positive) or invalid (negative) input; the
    failures of every operation are gathered, then reported together."""
    failures: dict[str, str] = {}
    operations = 0
    for result in fuzz_schema.get_all_operations():
        operation = result.ok()
        operations += 1

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            derandomize=True,  # the same cases every run: a failure here reproduces
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case: Case) -> None:
            # The token replaces whatever Authorization the case made up; a case made without
            # one (a negative case: the spec requires it) is sent without one.
            sent = case.headers or {}
            _short_waits(case)
            case.call_and_validate(headers=auth_headers if "Authorization" in sent else None)

        try:
            fuzz()
        except Unsatisfiable:  # no invalid input exists (no parameters, free strings)
            assert mode is GenerationMode.NEGATIVE, operation.label
            continue
        except (Exception, BaseExceptionGroup) as exc:  # one failure must not hide another
            failures[operation.label] = str(exc)
    paths = fuzz_app.openapi()["paths"].values()
    assert operations == sum(len(methods) for methods in paths) - 2  # all but drain, stream
    report = "\n\n".join(f"== {label}\n{text}" for label, text in failures.items())
    assert not failures, f"{len(failures)} of {operations} operations failed:\n{report}"


def _short_waits(case: Case) -> None:
    """A valid ``wait_s`` waits that long for a request that never comes (by design):
    fuzzed with waits of at most 10 ms, so 25 cases fit in the test's time."""
    wait = (case.query or {}).get("wait_s")
    if isinstance(wait, int | float) and not isinstance(wait, bool) and 0 < wait <= 10:
        assert case.query is not None
        case.query["wait_s"] = min(wait, 0.01)


def _st_run(daemon: Daemon, tmp_path: Path, *headers: str) -> None:
    """``st run --checks all`` against the daemon; fails with schemathesis' report."""
    command = [str(Path(sys.executable).with_name("st")), "run", f"{daemon.url}/openapi.json"]
    command += ["--checks", "all", "--exclude-path", "/v1/admin/drain", "--no-color"]
    # The stream follows forever; a request's GET waits up to wait_s for a request that
    # never comes (both fuzzed in-process above, the wait kept short).
    command += ["--exclude-path", "/v1/events/stream"]
    command += ["--exclude-path", "/v1/requests/{request_id}"]
    command += ["--max-examples", str(REAL_MAX_EXAMPLES), "--seed", "23", "--workers", "1"]
    command += ["--generation-database", "none", "--request-timeout", "60"]
    for header in headers:
        command += ["-H", header]
    ran = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout[-20_000:] + ran.stderr[-5_000:]
    assert " passed" in ran.stdout and "failure" not in ran.stdout.split("SUMMARY")[-1]


@pytest.fixture
def fuzzed(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> Daemon:
    return daemon_factory(make_settings(auth=FUZZ_AUTH))


def test_a_loopback_daemon_serving_without_a_token_passes_every_check(
    fuzzed: Daemon, tmp_path: Path
) -> None:
    _st_run(fuzzed, tmp_path)


def test_a_daemon_that_needs_tokens_passes_every_check(fuzzed: Daemon, tmp_path: Path) -> None:
    daemon = fuzzed
    token = daemon.token("fuzz", "sessions,operator,admin")
    _st_run(daemon, tmp_path, f"Authorization: Bearer {token}")
