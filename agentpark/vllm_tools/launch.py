"""``agentpark vllm serve``: start vLLM's OpenAI server with agentpark's KV connector.

The command line and environment are built here as plain data (``vllm_command``,
``vllm_env``) so they are tested without vLLM; ``serve`` then replaces this process with
vLLM (``os.execve``), so Ctrl-C and SIGTERM reach vLLM itself, which stops its engine
processes cleanly, and the exit status is vLLM's.

Before that it asks the daemon ``GET /v1/vllm``. With no ``--daemon`` given, a daemon that
is missing or runs the reference engine is replaced by one in vLLM mode started here
(:mod:`agentpark.vllm_tools.daemon_child`: it ends with vLLM); any other refusal, or any
refusal of a ``--daemon``, is one line naming the fix and exit 2, before vLLM starts.

- The server is ``python -m vllm.entrypoints.openai.api_server``: the ``vllm serve`` entry
  point asks for a distribution named ``vllm`` and fails with the CPU build (``vllm-cpu``).
- ``VLLM_CPU_NUM_OF_RESERVED_CPU=1``: a server with ``--kv-transfer-config`` reserves one
  more core for itself than one without, so on a small host the two run different OpenMP
  thread counts and their logprobs differ in the last bits; pinned, they are comparable.
- ``PYTHONPATH`` starts with the directory this agentpark is imported from, so vLLM's
  engine-core and worker processes import the connector from the same code.
- ``HF_HUB_OFFLINE=1``, ``VLLM_NO_USAGE_STATS=1``, ``DO_NOT_TRACK=1``: nothing is fetched
  or reported. Each of these is a default: a value already in the environment wins.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import agentpark
from agentpark.errors import ConfigError
from agentpark.vllm_tools.daemon_child import (
    ChildDaemon,
    DaemonStartError,
    pick_port,
    start_child_daemon,
)

__all__ = [
    "CONNECTOR_CLASS",
    "CONNECTOR_MODULE",
    "ENV_DEFAULTS",
    "SERVER_MODULE",
    "AutoDaemon",
    "Refusal",
    "check_daemon",
    "daemon_refusal",
    "kv_transfer_config",
    "local_daemon_url",
    "serve",
    "vllm_command",
    "vllm_env",
    "vllm_installed",
]

CONNECTOR_CLASS = "AgentparkConnector"
CONNECTOR_MODULE = "agentpark.connectors.vllm"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
INSTALL_HINT = "pip install 'agentpark[vllm]'"

ENV_DEFAULTS: Mapping[str, str] = {
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}

# Flags the launcher writes itself when the connector is on; given again they would fight.
_OWN_FLAGS = ("--kv-transfer-config",)


def local_daemon_url(host: str, port: int) -> str:
    """The URL a process on this host reaches the daemon at (a bind-all address is local)."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def kv_transfer_config(daemon_url: str, token: str | None = None) -> dict[str, Any]:
    """vLLM's ``--kv-transfer-config`` for agentpark's connector talking to ``daemon_url``."""
    extra: dict[str, Any] = {"daemon_url": daemon_url}
    if token:
        extra["token"] = token
    return {
        "kv_connector": CONNECTOR_CLASS,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def vllm_command(
    model: str,
    *,
    python: str,
    daemon_url: str | None,
    token: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The server's argv: ``daemon_url=None`` starts plain vLLM (no connector).

    ``extra_args`` go to vLLM unchanged, after agentpark's own flags.
    """
    argv = [python, "-m", SERVER_MODULE, "--model", model]
    if daemon_url is not None:
        clash = [a for a in extra_args if a.split("=", 1)[0] in _OWN_FLAGS]
        if clash:
            raise ConfigError(
                f"{clash[0].split('=', 1)[0]} is set by agentpark vllm serve; pass "
                "--no-connector to give your own"
            )
        config = kv_transfer_config(daemon_url, token)
        argv += ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
    return [*argv, *extra_args]


def _package_root() -> str:
    """The directory ``import agentpark`` resolved from (an editable checkout or site-packages)."""
    return str(Path(agentpark.__file__).resolve().parent.parent)


def vllm_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` plus ENV_DEFAULTS (where unset) and agentpark's root first on PYTHONPATH."""
    env = dict(base)
    for name, value in ENV_DEFAULTS.items():
        env.setdefault(name, value)
    root = _package_root()
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    env["PYTHONPATH"] = os.pathsep.join([root, *parts])
    return env


@dataclass(frozen=True)
class AutoDaemon:
    """Leave to the launcher a daemon the configured one cannot be: no ``--daemon`` given.

    ``state_dir`` is the configured one; the daemon it starts uses ``<state_dir>/vllm``.
    """

    state_dir: Path
    port: int
    config: Path | None = None


@dataclass(frozen=True)
class Refusal:
    """Why a daemon will not take the connector: ``kind`` and one line naming the fix."""

    kind: Literal["not_vllm", "token", "unreachable", "other"]
    line: str


def serve(
    model: str,
    *,
    daemon_url: str | None,
    token: str | None = None,
    extra_args: Sequence[str] = (),
    dry_run: bool = False,
    auto: AutoDaemon | None = None,
) -> int:
    """Exec vLLM (never returns) or, with ``dry_run``, print what would run and return 0.

    With ``auto``, a daemon at ``daemon_url`` that is missing or not in vLLM mode is
    replaced by one started here (agentpark.vllm_tools.daemon_child), which ends with vLLM.
    """
    vllm_command(model, python=sys.executable, daemon_url=daemon_url, extra_args=extra_args)
    if dry_run:
        return _dry_run(model, daemon_url, token, extra_args)
    if not vllm_installed():
        raise ConfigError(f"vLLM is not installed in {sys.executable}: {INSTALL_HINT}")
    line = f"agentpark: starting vLLM without a connector: {model}"
    if daemon_url is not None:
        refusal = check_daemon(daemon_url, token)
        if refusal is not None and auto is not None and refusal.kind in _STARTABLE:
            try:
                child = _start_daemon(auto, refusal)
            except DaemonStartError as exc:
                print(f"agentpark: {exc}", file=sys.stderr, flush=True)
                return 2
            why = "nothing answers there" if refusal.kind == "unreachable" else "not in vLLM mode"
            line = (
                f"agentpark: the daemon at {daemon_url}: {why}; started one in vLLM mode for "
                f"this vLLM at {child.url} (dashboard {child.url}/dashboard, `agentpark "
                f"status --url {child.url}`, state {child.state_dir}), stopped when vLLM "
                f"stops; starting vLLM: {model}"
            )
            daemon_url, token = child.url, None  # a fresh daemon: loopback, no tokens
        elif refusal is not None:  # said before vLLM starts, not in its log minutes later
            print(f"agentpark: {refusal.line}", file=sys.stderr, flush=True)
            return 2
        else:
            line = f"agentpark: starting vLLM with the daemon at {daemon_url}: {model}"
    argv = vllm_command(
        model, python=sys.executable, daemon_url=daemon_url, token=token, extra_args=extra_args
    )
    print(line, file=sys.stderr, flush=True)
    os.execve(sys.executable, argv, vllm_env(os.environ))
    raise AssertionError("unreachable: execve returned")  # pragma: no cover


_STARTABLE = ("not_vllm", "unreachable")


def _dry_run(
    model: str, daemon_url: str | None, token: str | None, extra_args: Sequence[str]
) -> int:
    argv = vllm_command(
        model, python=sys.executable, daemon_url=daemon_url, token=token, extra_args=extra_args
    )
    env = vllm_env(os.environ)
    for name in (*ENV_DEFAULTS, "PYTHONPATH"):
        print(f"{name}={env[name]}")
    print(" ".join(_quote(a) for a in argv))
    return 0


def _start_daemon(auto: AutoDaemon, refusal: Refusal) -> ChildDaemon:
    """The vLLM-mode daemon: on the configured port when nothing answers there, else the
    next one (8471 beside a reference daemon on 8470), else any free port."""
    preferred = auto.port if refusal.kind == "unreachable" else auto.port + 1
    port = pick_port("127.0.0.1", preferred)
    return start_child_daemon(auto.state_dir / "vllm", port, config=auto.config)


def daemon_refusal(daemon_url: str, token: str | None, timeout_s: float = 5.0) -> str | None:
    """Why the daemon at ``daemon_url`` will not take this vLLM's connector, in one line
    naming the fix; None when it serves vLLM (``GET /v1/vllm`` answers 200)."""
    refusal = check_daemon(daemon_url, token, timeout_s)
    return None if refusal is None else refusal.line


def check_daemon(daemon_url: str, token: str | None, timeout_s: float = 5.0) -> Refusal | None:
    """:func:`daemon_refusal` with the kind of refusal (what the launcher can fix itself)."""
    request = urllib.request.Request(f"{daemon_url.rstrip('/')}/v1/vllm")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return None
    except urllib.error.HTTPError as exc:
        if exc.code == 409:
            return Refusal(
                "not_vllm",
                f"the daemon at {daemon_url} does not serve vLLM: restart it with "
                "`AGENTPARK_VLLM__ENABLED=true agentpark serve` (or [vllm] enabled = true), "
                "or leave out --daemon and the launcher starts one; --no-connector runs "
                "vLLM without agentpark",
            )
        if exc.code in (401, 403):
            return Refusal(
                "token",
                f"the daemon at {daemon_url} refused the token ({exc.code}): pass --token "
                "(or AGENTPARK_TOKEN) with the sessions scope",
            )
        return Refusal("other", f"the daemon at {daemon_url} answered GET /v1/vllm with {exc.code}")
    except (OSError, ValueError) as exc:
        return Refusal(
            "unreachable",
            f"no agentpark daemon answers at {daemon_url} ({exc}): start it with "
            "`AGENTPARK_VLLM__ENABLED=true agentpark serve`, or leave out --daemon and the "
            "launcher starts one",
        )


def vllm_installed() -> bool:
    """Whether this python can import vLLM (the server runs with this same python)."""
    return importlib.util.find_spec("vllm") is not None


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)
