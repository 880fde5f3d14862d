"""A vLLM server as a child process: started through ``agentpark vllm serve``, ready when its
log says so, stopped with every process it spawned. Used by ``agentpark bench vllm`` and the
real-vLLM tests (tests/vllm_real/conftest.py).

Readiness is uvicorn's "Application startup complete" line: a reader thread copies the
server's output into its log file and sets an event on that line, or when the output ends
(the server exited), so nothing polls. Stopping sends one signal (SIGTERM by default) to
vLLM itself (the launcher exec'd into it), waits for the whole process tree, SIGKILLs what
is left, and records those pids in ``killed`` (empty when vLLM stopped cleanly). The server
runs in a process group of its own, so nothing it spawned outlives ``stop``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

__all__ = ["READY_LINE", "VllmServer", "free_port", "start_server"]

READY_LINE = "Application startup complete"
STARTUP_TIMEOUT_S = 300.0  # a cold start on a loaded 2-core machine (~30 s when idle)
STOP_TIMEOUT_S = 60.0


def free_port() -> int:
    """A loopback port free now (the server binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class VllmServer:
    """One vLLM server process tree, started by ``agentpark vllm serve`` on a fixed port.

    ``daemon_url=None`` runs it without the connector (``--no-connector``). Every server
    runs ``--enforce-eager --dtype bfloat16 --enable-prompt-tokens-details`` (the last so
    ``usage.prompt_tokens_details.cached_tokens`` reports the tokens vLLM did not compute).
    """

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
    killed: list[int] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
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
        vllm += ["--dtype", "bfloat16", caching, "--enable-prompt-tokens-details"]
        if self.num_gpu_blocks is not None:
            vllm += ["--num-gpu-blocks-override", str(self.num_gpu_blocks)]
        return [*argv, "--", *vllm, *self.extra_args]

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Start and wait for the ready line; RuntimeError with the log's tail if none comes."""
        assert self.process is None, "already running"
        log = self.log_path.open("ab")
        log.write(f"==== {' '.join(self.argv())}\n".encode())
        log.flush()
        self.process = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
            start_new_session=True,  # one process group: the whole tree can be stopped
        )
        ready = threading.Event()
        assert self.process.stdout is not None
        self._reader = threading.Thread(
            target=_copy_log, args=(self.process.stdout, log, ready), daemon=True
        )
        self._reader.start()
        ready.wait(timeout_s)  # set by the ready line, or when the output ends (exit)
        code = self.process.poll()
        if ready.is_set() and code is None:
            return
        self.stop()
        state = f"exited with {code}" if code is not None else f"not ready in {timeout_s:.0f} s"
        raise RuntimeError(f"vLLM on port {self.port} {state}; log {self.log_path}:\n{self.tail()}")

    def tree(self) -> list[int]:
        """Pids of the server and every process it has spawned (engine core, workers)."""
        import psutil

        root = psutil.Process(self.pid)
        return [root.pid, *(child.pid for child in root.children(recursive=True))]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` to vLLM (it stops its engine processes), then SIGKILL what is left."""
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
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(alive, timeout=STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError):
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


def start_server(
    python: Path,
    model: Path,
    log_path: Path,
    *,
    daemon_url: str | None = None,
    prefix_caching: bool = True,
    num_gpu_blocks: int | None = None,
    extra_args: Sequence[str] = (),
    token: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = STARTUP_TIMEOUT_S,
) -> VllmServer:
    """A :class:`VllmServer` on a free port, started (stopped again if it fails to start)."""
    server = VllmServer(
        python=python,
        model=Path(model),
        port=free_port(),
        log_path=log_path,
        daemon_url=daemon_url,
        prefix_caching=prefix_caching,
        num_gpu_blocks=num_gpu_blocks,
        extra_args=tuple(extra_args),
        token=token,
        env=dict(env or {}),
    )
    server.start(timeout_s)
    return server
