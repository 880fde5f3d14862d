"""The agentpark daemon of ``agentpark bench vllm``'s agentpark run: ``agentpark serve`` in
vLLM mode as a child process, with a free port, a temporary state dir and pool."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from agentpark.vllm_tools.process import free_port

__all__ = ["BenchDaemon"]


class BenchDaemon:
    """``agentpark serve`` in vLLM mode: a child process, a free port, a temporary state dir."""

    def __init__(
        self,
        state_dir: Path,
        pool_bytes: int,
        time_scale: float,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``env``: AGENTPARK_* settings of this run (the machine's own are never passed)."""
        self.shm_dir = Path(tempfile.mkdtemp(prefix="agentpark-bench-vllm-", dir="/dev/shm"))
        self.pool_path = self.shm_dir / "pool"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = state_dir / "bench.toml"
        config.write_text(
            f'state_dir = "{state_dir}"\nlog_level = "info"\n'
            f"[server]\nport = {self.port}\n"
            f"[vllm]\nenabled = true\npool_capacity = {pool_bytes}\n"
            f'pool_path = "{self.pool_path}"\n'
            # The policy's own times scale with the workload's, as the pauses do.
            f"[policy]\nidle_pause_after_s = 0\nmin_pause_s = {2.0 * time_scale}\n"
        )
        child = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPARK_")}
        child.update(env or {})
        self.log_path = state_dir / "daemon.log"
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentpark", "serve", "--config", str(config)],
            env=child,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            if b"Application startup complete" in line:
                self._ready.set()
        self._ready.set()
        self._log.close()

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        self._ready.wait(timeout_s)
        if self.proc.poll() is not None or not self._ready.is_set():
            tail = self.log_path.read_text(errors="replace").splitlines()[-30:]
            raise RuntimeError("the daemon did not start:\n" + "\n".join(tail))

    def host(self) -> dict[str, Any]:
        answer: dict[str, Any] = httpx.get(f"{self.url}/v1/host", timeout=30).json()
        return answer

    def events(self) -> list[dict[str, Any]]:
        """Every event of the run (a bench run makes far fewer than the page's 10,000)."""
        answer = httpx.get(f"{self.url}/v1/events", params={"limit": 10_000}, timeout=30)
        answer.raise_for_status()
        events: list[dict[str, Any]] = answer.json()["events"]
        return events

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.shm_dir, ignore_errors=True)  # the pool: no /dev/shm file left
