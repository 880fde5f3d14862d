"""The daemon ``agentpark vllm serve`` starts for its vLLM (agentpark.vllm_tools.daemon_child
says when and why): ``agentpark serve`` that ends when that vLLM does, then removes its
/dev/shm folder, whose pool no other engine can use.

``python -m agentpark.cli.vllm_daemon PARENT_PID SERVE_ARGS...``: the state dir and vLLM
mode come in the environment; PARENT_PID is the launcher, which is vLLM once it has exec'd.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import sys
from pathlib import Path

__all__ = ["main"]

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """SIGTERM when ``parent`` (vLLM, once the launcher has exec'd) ends; exit if it has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # it ended before the line above took effect
        raise SystemExit(0)


def _remove_shm_folder(state_dir: Path) -> None:
    """The state dir's private /dev/shm folder and its record, unless another daemon holds
    the state dir (this one never started: the folder is that one's)."""
    from agentpark.errors import ConfigError
    from agentpark.statedir import StateLock
    from agentpark.tiers.shm import SHM_DIR_RECORD, SHM_ROOT

    try:
        lock = StateLock.acquire(state_dir)
    except ConfigError:
        return
    try:
        record = state_dir / SHM_DIR_RECORD
        with contextlib.suppress(FileNotFoundError, UnicodeDecodeError):
            folder = Path(record.read_text().strip())
            if folder.parent == SHM_ROOT and folder.name.startswith("agentpark-"):
                shutil.rmtree(folder, ignore_errors=True)
            record.unlink()
    finally:
        lock.release()


class _Stopped(BaseException):
    """SIGTERM arrived where uvicorn does not take it: before it runs, or re-raised by it
    once its clean shutdown is done (uvicorn re-raises the signal it caught)."""


def _stop(signum: int, frame: object) -> None:
    raise _Stopped


def main(argv: list[str]) -> int:
    """The child: die with the launcher's vLLM, serve, then drop the pool's folder."""
    signal.signal(signal.SIGTERM, _stop)  # before the parent check: no SIGTERM is lost
    _die_with_parent(int(argv[0]))
    state_dir = Path(os.environ["AGENTPARK_STATE_DIR"])
    try:
        from agentpark.cli.entry import main as cli_main

        return cli_main(["serve", *argv[1:]])
    except _Stopped:
        return 0
    finally:
        _remove_shm_folder(state_dir)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
