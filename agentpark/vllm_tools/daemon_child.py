"""A vLLM-mode daemon that ``agentpark vllm serve`` starts for its vLLM and that ends with it.

When no daemon answers at the configured address, or the one there runs the reference
engine (``[vllm] enabled`` off), the launcher starts ``agentpark serve`` itself, in vLLM
mode, as a child: state dir ``<state_dir>/vllm`` (its own lock, database, control socket
and /dev/shm folder: it never fights the reference daemon's), on loopback at the
configured port when nothing holds it, else the next port, else any free one. It waits
for ``GET /v1/vllm`` to answer, then execs vLLM as without it.

Why a child that outlives the exec, not a supervisor: vLLM stays the launcher's own pid
(Ctrl-C, SIGTERM and the exit status are vLLM's, as before), and the kernel tells the
daemon when vLLM is gone, however it ended (``PR_SET_PDEATHSIG``: SIGTERM, which the
daemon takes as a clean shutdown). The daemon runs in a session of its own, so a Ctrl-C at
the terminal reaches vLLM only; the daemon stops after it. Its pool is of no use once
that vLLM is gone (another engine makes parked copies lost), so on the way out the child
removes its /dev/shm folder: nothing is left behind but the state dir.

The child's own side (dying with vLLM, removing the folder) is
:mod:`agentpark.cli.vllm_daemon`, run as ``python -m agentpark.cli.vllm_daemon``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CHILD_MODULE",
    "ChildDaemon",
    "DaemonStartError",
    "pick_port",
    "start_child_daemon",
]

READY_TIMEOUT_S = 120.0  # a cold start (migrations, imports) on a loaded 2-core machine
STOP_TIMEOUT_S = 30.0
LOG_NAME = "daemon.log"
CHILD_MODULE = "agentpark.cli.vllm_daemon"


class DaemonStartError(Exception):
    """The daemon the launcher started did not come up: one line naming the fix."""


@dataclass
class ChildDaemon:
    """The started daemon: where it answers, its state dir and log, its process."""

    url: str
    state_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM and wait (SIGKILL past ``timeout_s``); before vLLM starts only."""
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def pick_port(host: str, preferred: int) -> int:
    """``preferred`` when it can be bound on ``host`` now, else ``preferred + 1``, else any."""
    import socket

    for port in (preferred, preferred + 1, 0):
        if not 0 <= port <= 65535:
            continue
        with socket.socket() as sock:
            # As uvicorn binds: a port a stopped daemon left in TIME_WAIT is free to it.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError:
                continue
            chosen: int = sock.getsockname()[1]
            return chosen
    raise DaemonStartError(f"no free port on {host}")  # pragma: no cover: port 0 binds


def start_child_daemon(
    state_dir: Path,
    port: int,
    *,
    config: Path | None,
    timeout_s: float = READY_TIMEOUT_S,
) -> ChildDaemon:
    """Start the vLLM-mode daemon on 127.0.0.1:``port`` with ``state_dir``; return it once
    ``GET /v1/vllm`` answers. DaemonStartError (the child stopped) when it does not."""
    from agentpark.statedir import private_dir
    from agentpark.vllm_tools.launch import daemon_refusal

    private_dir(state_dir)
    log_path = state_dir / LOG_NAME
    env = dict(os.environ)
    env.update(
        AGENTPARK_VLLM__ENABLED="true",
        AGENTPARK_STATE_DIR=str(state_dir),
        AGENTPARK_DB_URL=f"sqlite:///{state_dir / 'agentpark.db'}",
        AGENTPARK_VLLM__CONTROL_SOCKET=str(state_dir / "control.sock"),
    )
    argv = [sys.executable, "-m", CHILD_MODULE, str(os.getpid())]
    if config is not None:
        argv += ["--config", str(config)]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a Ctrl-C at the terminal reaches vLLM only
        )
    url = f"http://127.0.0.1:{port}"
    child = ChildDaemon(url, state_dir, log_path, process)
    deadline = time.monotonic() + timeout_s
    while daemon_refusal(url, None, timeout_s=2.0) is not None:
        try:
            code = process.wait(timeout=0.2)  # the tick: also notices an exit at once
        except subprocess.TimeoutExpired:
            if time.monotonic() < deadline:
                continue
            child.stop()
            raise DaemonStartError(
                f"the vLLM-mode daemon it started did not answer at {url} within "
                f"{timeout_s:.0f} s (log {log_path}): start one yourself with "
                "`AGENTPARK_VLLM__ENABLED=true agentpark serve` and pass --daemon URL"
            ) from None
        raise DaemonStartError(
            f"the vLLM-mode daemon it started exited with {code}: {_last_line(log_path)} "
            f"(log {log_path}); fix that, or pass --daemon URL of a daemon in vLLM mode"
        )
    return child


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"
