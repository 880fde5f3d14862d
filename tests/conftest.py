"""Shared fixtures: settings on a temporary state dir, the app in-process, real daemons.

- ``app_client``: an ``AgentparkClient`` on one warmed app per test module, run in this
  process without a server (``shared_app``), with a tenant of its own; for contract tests.
- ``app_factory``: the same, for a test that needs its own settings.
- ``daemon`` / ``daemon_factory``: a real uvicorn server on a loopback port, for what
  needs one (HTTP itself, concurrency, drain); ``daemon_process``: a real child process.

Only fixtures and pytest's hooks live here; what they are made of (and what tests import)
is in :mod:`tests.harness`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import pytest

from agentpark.client import AgentparkClient
from agentpark.config import Settings
from tests.harness.daemon import Daemon, DaemonProcess, start_daemon
from tests.harness.inprocess import InProcessApp, run_in_process
from tests.harness.run import configure_run, private_shm_dir, remove_leaks, unconfigure_run
from tests.harness.settings import tiny_settings, unset_agentpark_env

# tests/vllm_real run real vLLM servers: only in .venv-vllm, one process, after the main
# suite (`make test-vllm`, which sets the variable); the main run never collects them.
VLLM_TESTS_ENV = "AGENTPARK_VLLM_TESTS"
collect_ignore = [] if os.environ.get(VLLM_TESTS_ENV) == "1" else ["vllm_real"]


def pytest_configure(config: pytest.Config) -> None:
    configure_run(controller=not hasattr(config, "workerinput"))  # the controller, or no xdist


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput"):
        return  # the controller checks, after every worker has finished
    if remove_leaks(config._tmp_path_factory.getbasetemp()):  # type: ignore[attr-defined]
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    unconfigure_run()


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AGENTPARK_* variable of the machine leaks into a test."""
    unset_agentpark_env(monkeypatch)


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A private directory under /dev/shm (real shared memory), removed afterwards."""
    with private_shm_dir() as path:
        yield path


@pytest.fixture
def make_settings(tmp_path: Path, shm_dir: Path) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        return tiny_settings(tmp_path / "state", shm_dir, **overrides)

    return make


@pytest.fixture(scope="module")
def shared_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessApp]:
    """One warmed app (TINY settings) for a whole test module; see ``app_client``."""
    with pytest.MonkeyPatch.context() as env, private_shm_dir() as shm:
        unset_agentpark_env(env)
        settings = tiny_settings(tmp_path_factory.mktemp("shared") / "state", shm)
        with run_in_process(settings) as running:
            yield running


_counter = iter(range(1_000_000))


@pytest.fixture
def app_client(
    shared_app: InProcessApp, request: pytest.FixtureRequest
) -> Iterator[AgentparkClient]:
    """A client of ``shared_app`` with a tenant of its own, named after the test.

    Afterwards the sessions of every tenant the test used are deleted and the pool and
    tiers must be empty again, so a test may assert host totals as on a fresh daemon.
    What is not per tenant carries over between the module's tests: counters, events of
    the host, and the learned pauses of each tool (use a tool name no other test uses).
    """
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-.")[:100]
    yield shared_app.client(f"{next(_counter)}-{name}")
    shared_app.forget_tenants()
    host = shared_app.runtime.host_snapshot()
    assert host.pool.used_blocks == 0, "a test left KV in the shared app's pool"
    assert all(t.used_blocks == 0 for t in host.tiers.values()), host.tiers


@pytest.fixture
def app_factory() -> Iterator[Callable[..., InProcessApp]]:
    """Start an in-process app with these settings; each is shut down after the test."""
    with ExitStack() as stack:

        def start(settings: Settings, *, anonymous: bool = False) -> InProcessApp:
            running: AbstractContextManager[InProcessApp] = run_in_process(
                settings, anonymous=anonymous
            )
            return stack.enter_context(running)

        yield start


@pytest.fixture
def daemon_factory() -> Iterator[Callable[[Settings], Daemon]]:
    started: list[Daemon] = []

    def start(settings: Settings) -> Daemon:
        daemon = start_daemon(settings)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.close()


@pytest.fixture
def daemon(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> Daemon:
    return daemon_factory(make_settings())


@pytest.fixture
def daemon_process() -> Iterator[Callable[[Path, int], DaemonProcess]]:
    started: list[DaemonProcess] = []

    def start(config: Path, port: int) -> DaemonProcess:
        proc = DaemonProcess(config, port)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.reap()
