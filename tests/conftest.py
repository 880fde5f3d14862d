"""Shared fixtures: settings on a temporary state dir, the app in-process, real daemons.

- ``app_client``: an ``AgentparkClient`` on one warmed app per test module, run in this
  process without a server (``shared_app``), with a tenant of its own; for contract tests.
- ``app_factory``: the same, for a test that needs its own settings.
- ``daemon`` / ``daemon_factory``: a real uvicorn server on a loopback port, for what
  needs one (HTTP itself, concurrency, drain); ``daemon_process``: a real child process.

Auth: an in-process app has no bind, so it is built with ``anonymous=False`` (every
request needs a token) unless a test asks otherwise; its ``client(tenant)`` makes a token
of that tenant (sessions and operator scopes) in the app's database. A ``Daemon`` binds
127.0.0.1, so it has the loopback default (tenant ``default``, no token) until a test
makes a token (``Daemon.token``); admin routes always need one (``Daemon.admin``).
"""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from anyio.from_thread import BlockingPortal, start_blocking_portal
from fastapi import FastAPI

from agentpark.app import create_app
from agentpark.auth import Gate, Scope, parse_scopes
from agentpark.client import AgentparkAPIError, AgentparkClient
from agentpark.config import Settings, load_settings
from agentpark.runtime import Runtime
from agentpark.store.models import SessionRow

# tests/vllm_real run real vLLM servers: only in .venv-vllm, one process, after the main
# suite (`make test-vllm`, which sets the variable); the main run never collects them.
VLLM_TESTS_ENV = "AGENTPARK_VLLM_TESTS"
collect_ignore = [] if os.environ.get(VLLM_TESTS_ENV) == "1" else ["vllm_real"]

# Small and fast: 2-layer model, 64 blocks of 16 tokens, room for 32 parked blocks.
TINY = {
    "model": {"max_seq_len": 512},
    "pool": {"block_size": 16, "num_blocks": 64},
    "tiers": {"dram": {"capacity": 32 * 4096}},
    # No idle parking unless a test asks: a slow machine must not park sessions mid-test.
    "policy": {"idle_pause_after_s": 0, "tick_s": 0.05},
}


def _unset_agentpark_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("AGENTPARK_"):
            monkeypatch.delenv(name)


# JAX's persistent compilation cache, for this test session only (never the product's default):
# the session's processes (pytest-xdist workers, `agentpark serve` children, which inherit
# the environment) then compile each step shape once between them. A fresh directory per
# session, so nothing compiled by an earlier run or another checkout is ever loaded.
_JAX_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
_jax_cache_dir: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    import os
    import tempfile

    import jax

    global _jax_cache_dir
    if not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        _jax_cache_dir = Path(tempfile.mkdtemp(prefix="agentpark-test-jax-cache-"))
        os.environ[_JAX_CACHE_ENV] = str(_jax_cache_dir)
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # cache every step
        # A size limit turns on the cache's file lock: processes write it concurrently.
        os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(1 << 30)
        os.environ[_SHM_TAG_ENV] = os.urandom(4).hex()  # this run's /dev/shm folders
    # This process imported jax before the variables were set (a worker inherits them).
    jax.config.update("jax_compilation_cache_dir", os.environ[_JAX_CACHE_ENV])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_compilation_cache_max_size", 1 << 30)


# ---- no tier file left behind -------------------------------------------------------------
# Every /dev/shm folder the tests make is named SHM_TEST_PREFIX + ...: the run's own tag (made
# by the controller, inherited by the xdist workers and daemon children) tells this run's
# folders from those of another run on the same machine. A tier file at the default shm
# path carries its state dir in its header, which for a test is under the run's basetemp.
# The controller checks both once every worker is done, fails the run on a leak, and
# removes what it found (each leak is hundreds of MiB of RAM on a real config).
_SHM_TAG_ENV = "PYTEST_AGENTPARK_SHM_TAG"
SHM_ROOT = Path("/dev/shm")


def shm_test_prefix() -> str:
    """The name prefix of this run's folders under /dev/shm."""
    import os

    return f"agentpark-test-{os.environ[_SHM_TAG_ENV]}-"


def _leaked_shm(basetemp: Path) -> list[Path]:
    from agentpark.tiers.filetier import read_header

    leaked: list[Path] = []
    for entry in sorted(SHM_ROOT.glob("agentpark-*")):
        if entry.name.startswith(shm_test_prefix()):
            leaked.append(entry)
            continue
        if entry.is_symlink():
            continue
        # A daemon's private shm folder (tiers.shm.shm_dir) leaks with the files in it.
        inside = sorted(entry.iterdir()) if entry.is_dir() else [entry]
        for path in inside:
            if not path.is_file() or path.is_symlink():
                continue
            try:
                owner = read_header(path).get("state_dir")
            except (ValueError, OSError):
                continue
            if owner and Path(owner).is_relative_to(basetemp.resolve()):
                leaked.append(entry)
                break
    return leaked


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import shutil

    config = session.config
    if hasattr(config, "workerinput"):
        return  # the controller checks, after every worker has finished
    leaked = _leaked_shm(config._tmp_path_factory.getbasetemp())  # type: ignore[attr-defined]
    if not leaked:
        return
    lines = "\n".join(f"  {path}" for path in leaked)
    print(f"\nthe test run left these in {SHM_ROOT} (now removed):\n{lines}")
    for path in leaked:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    if _jax_cache_dir is not None:
        shutil.rmtree(_jax_cache_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AGENTPARK_* variable of the machine leaks into a test."""
    _unset_agentpark_env(monkeypatch)


@contextmanager
def _private_shm_dir() -> Iterator[Path]:
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=shm_test_prefix(), dir=SHM_ROOT))
    try:
        yield path
    finally:
        # A daemon thread finishing its shutdown may still make a file in here (a tier
        # file noticed gone is made again) while rmtree runs; a few passes get both.
        for _ in range(5):
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                break


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A private directory under /dev/shm (real shared memory), removed afterwards."""
    with _private_shm_dir() as path:
        yield path


def tiny_settings(state_dir: Path, shm_dir: Path, /, **overrides: Any) -> Settings:
    """TINY with ``overrides`` merged in, on this state dir (unless one overrides it) and shm."""
    tiers = {**TINY["tiers"], "shm": {"capacity": 32 * 4096, "path": shm_dir / "tier"}}
    merged: dict[str, Any] = {"state_dir": state_dir, **TINY, "tiers": tiers}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return load_settings(None, **merged)


@pytest.fixture
def make_settings(tmp_path: Path, shm_dir: Path) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        return tiny_settings(tmp_path / "state", shm_dir, **overrides)

    return make


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


class _PortalTransport(httpx.BaseTransport):
    """A blocking httpx transport onto an ASGI app whose event loop runs in another thread.

    Each request is handed to httpx's ``ASGITransport`` on that loop (the one the app's
    lifespan runs in) and waited for; requests from several threads run concurrently.
    """

    def __init__(self, app: FastAPI, portal: BlockingPortal) -> None:
        self._asgi = httpx.ASGITransport(app=app)
        self._portal = portal

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()  # a replayable body the async side can read too
        return self._portal.call(self._handle, request)

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        answer = await self._asgi.handle_async_request(request)
        raw = b"".join([chunk async for chunk in answer.aiter_raw()])
        return httpx.Response(answer.status_code, headers=answer.headers, content=raw)


class TenantClient(AgentparkClient):
    """A client with a token of one tenant; ``tenant`` and ``token`` kept for the test."""

    def __init__(self, url: str, tenant: str, token: str, **kwargs: Any) -> None:
        super().__init__(url, token=token, **kwargs)
        self.tenant = tenant
        self.token = token


SESSIONS_AND_OPERATOR = "sessions,operator"


def make_token(app: FastAPI, tenant: str, scopes: str = SESSIONS_AND_OPERATOR) -> str:
    """A new token of ``tenant`` in a running app's database (as `agentpark token create`)."""
    gate: Gate = app.state.gate
    token, _ = gate.store.create(tenant, parse_scopes(scopes))
    return token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class InProcessApp:
    """``create_app(settings)`` with its lifespan running in this process, and no server."""

    settings: Settings
    app: FastAPI
    transport: httpx.BaseTransport
    clients: list[AgentparkClient] = field(default_factory=list)

    @property
    def runtime(self) -> Runtime:
        runtime: Runtime = self.app.state.runtime
        return runtime

    def token(self, tenant: str = "default", scopes: str = SESSIONS_AND_OPERATOR) -> str:
        return make_token(self.app, tenant, scopes)

    def client(self, tenant: str = "default", scopes: str = SESSIONS_AND_OPERATOR) -> TenantClient:
        """A client of this app (closed with it) with a new token of ``tenant``."""
        token = self.token(tenant, scopes)
        client = TenantClient("http://in-process", tenant, token, transport=self.transport)
        self.clients.append(client)
        return client

    def forget_tenants(self) -> None:
        """Delete every session the clients handed out so far made, and close them."""
        for client in self.clients:
            try:
                for session in list(client.iter_sessions(page_size=1000)):
                    client.delete_session(session.session_id)
            except AgentparkAPIError as exc:  # a token without the sessions scope made none
                assert exc.status in (401, 403), exc
            client.close()
        self.clients.clear()


@contextmanager
def run_in_process(
    settings: Settings, config_path: Path | None = None, *, anonymous: bool = False
) -> Iterator[InProcessApp]:
    """Run the app's lifespan (runtime start, warm-up, shutdown) on a portal's event loop.

    No bind, so no loopback default unless ``anonymous``: every request needs a token.
    """
    app = create_app(settings, config_path, anonymous=anonymous)
    with start_blocking_portal() as portal, ExitStack() as stack:
        stack.enter_context(portal.wrap_async_context_manager(app.router.lifespan_context(app)))
        running = InProcessApp(settings, app, _PortalTransport(app, portal))
        stack.callback(running.forget_tenants)
        assert running.runtime.ready.wait(timeout=120), "engine warm-up did not finish"
        yield running


@pytest.fixture(scope="module")
def shared_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessApp]:
    """One warmed app (TINY settings) for a whole test module; see ``app_client``."""
    with pytest.MonkeyPatch.context() as env, _private_shm_dir() as shm:
        _unset_agentpark_env(env)
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


@dataclass
class Daemon:
    """A real uvicorn server in a thread of this process, on a free loopback port."""

    settings: Settings
    url: str
    client: httpx.Client
    app: FastAPI
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def runtime(self) -> Runtime:
        runtime: Runtime = self.app.state.runtime
        return runtime

    def token(self, tenant: str = "default", scopes: str = SESSIONS_AND_OPERATOR) -> str:
        """A new token in this daemon's database (from then on every request needs one)."""
        return make_token(self.app, tenant, scopes)

    def admin(self) -> dict[str, str]:
        """A token of tenant default with every scope, sent by ``client`` from now on.

        Admin routes need a token even on loopback, and once one exists every request
        needs one: the test's client keeps acting as tenant default, now with a token.
        """
        headers = bearer(self.token("default", ",".join(s.value for s in Scope)))
        self.client.headers.update(headers)
        return headers

    def stop(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "daemon did not stop"


def start_daemon(settings: Settings, config_path: Path | None = None) -> Daemon:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections queue here until uvicorn accepts: no start-up polling
    port = sock.getsockname()[1]
    app = create_app(settings, config_path, anonymous=True)  # bound to 127.0.0.1 below
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    app.state.request_shutdown = lambda: setattr(server, "should_exit", True)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=url, timeout=60)
    daemon = Daemon(settings, url, client, app, server, thread)
    assert client.get("/healthz").status_code == 200
    assert daemon.runtime.ready.wait(timeout=120), "engine warm-up did not finish"
    return daemon


@pytest.fixture
def daemon_factory() -> Iterator[Callable[[Settings], Daemon]]:
    started: list[Daemon] = []

    def start(settings: Settings) -> Daemon:
        daemon = start_daemon(settings)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        if daemon.thread.is_alive():
            daemon.stop()
        else:  # it stopped itself (a drain)
            daemon.client.close()


@pytest.fixture
def daemon(
    make_settings: Callable[..., Settings], daemon_factory: Callable[[Settings], Daemon]
) -> Daemon:
    return daemon_factory(make_settings())


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait for a condition another thread makes true; fail loudly at the deadline."""
    import time

    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s")
        tick.wait(0.005)


def session_row(**fields: Any) -> SessionRow:
    """A session row as the core writes a new one, with ``fields`` changed."""
    values: dict[str, Any] = {
        "session_id": "s",
        "tenant": "t",
        "state": "active",
        "tier": None,
        "num_tokens": 0,
        "kv_blocks": 0,
        "kv_bytes": 0,
        "created_at": 1_700_000_000.0,
        "last_active_at": 1_700_000_000.0,
        "pause_count": 0,
        "meta": {},
        "token_log": b"",
    }
    return SessionRow(**{**values, **fields})


def settled(daemon: Daemon, session_id: str, state: str, tenant: str = "default") -> bool:
    """The session shows ``state`` and no operation holds it any more.

    A background operation (a wait=false copy, the policy loop) sets the session's new state
    a moment before it commits its event and lets go of the session: a test that acts on the
    new state waits for both.
    """
    core = daemon.runtime.parking
    row = core.get(tenant, session_id)
    live = core.registry.find((tenant, session_id))
    return row.state == state and (live is None or not live.busy)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class DaemonProcess:
    """`agentpark serve` as a real child process (for kill -9 and SIGTERM tests)."""

    def __init__(self, config: Path, port: int) -> None:
        import os
        import subprocess
        import sys

        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPARK_")}
        env["PYTHONUNBUFFERED"] = "1"
        # --config after the subcommand: what `agentpark serve --config FILE` has to accept
        cmd = [sys.executable, "-m", "agentpark", "serve", "--config", str(config)]
        cmd += ["--port", str(port)]
        self.url = f"http://127.0.0.1:{port}"
        self.log: list[str] = []
        self.proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        for line in self.proc.stderr:  # blocks until uvicorn says it listens
            self.log.append(line)
            if "Uvicorn running on" in line:
                break
        self._drain = threading.Thread(target=self._read_rest, daemon=True)
        self._drain.start()
        assert self.proc.poll() is None, "daemon exited early:\n" + "".join(self.log)
        self.client = httpx.Client(base_url=self.url, timeout=60)
        wait_until(lambda: self.client.get("/readyz").status_code == 200, timeout=120)

    def _read_rest(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self, sig: int) -> int:
        """Send ``sig`` and wait for the process to end; returns its exit code."""
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=120)
        self._drain.join(timeout=10)
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return code


@pytest.fixture
def daemon_process() -> Iterator[Callable[[Path, int], DaemonProcess]]:
    import signal

    started: list[DaemonProcess] = []

    def start(config: Path, port: int) -> DaemonProcess:
        proc = DaemonProcess(config, port)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.proc.poll() is None:
            proc.stop(signal.SIGKILL)
        proc.client.close()
        proc.proc.wait(timeout=60)
        proc._drain.join(timeout=10)
        if proc.proc.stderr is not None and not proc.proc.stderr.closed:
            proc.proc.stderr.close()


def write_config(path: Path, settings: Settings) -> Path:
    """The settings as a TOML file a child process can read."""
    lines = [f'state_dir = "{settings.state_dir}"']
    for section in ("model", "pool", "limits", "integrity", "shutdown", "policy"):
        lines.append(f"[{section}]")
        for key, value in getattr(settings, section).model_dump().items():
            lines.append(f"{key} = {_toml(value)}")
    for tier in ("dram", "shm", "disk"):
        lines.append(f"[tiers.{tier}]")
        for key, value in getattr(settings.tiers, tier).model_dump().items():
            if value is not None:
                lines.append(f"{key} = {_toml(value)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return f'"{value}"'
