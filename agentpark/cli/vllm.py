"""``agentpark make-model``, ``agentpark vllm serve`` and ``agentpark vllm demo``: a small
checkpoint for vLLM, vLLM's OpenAI server started with agentpark's KV connector, and a
two-minute run showing what it changes (needs agentpark[vllm])."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from agentpark.cli.common import Commands, Subparsers
from agentpark.config import load_settings
from agentpark.errors import ConfigError

__all__ = ["add_vllm_commands", "run_make_model", "run_vllm_demo", "run_vllm_serve"]


def add_vllm_commands(commands: Commands, sub: Subparsers[argparse.ArgumentParser]) -> None:
    _add_make_model(commands, sub)
    vllm_sub = commands.group(
        sub,
        "vllm",
        "vllm commands",
        help="vLLM with agentpark's KV connector (needs agentpark[vllm])",
    )
    vllm_serve = commands.add(
        vllm_sub,
        "serve",
        help="start vLLM's OpenAI server with the connector set for a daemon; "
        "arguments after -- go to vLLM unchanged",
        usage="agentpark vllm serve MODEL [--daemon URL] [--token T] [--no-connector] "
        "[--dry-run] [-- VLLM_ARGS ...]",
    )
    vllm_serve.add_argument("model", help="model directory or name, vLLM's --model")
    vllm_serve.add_argument(
        "--daemon",
        help="the agentpark daemon's URL, used as it is (default: the config's server "
        "section; when nothing answers there or that daemon is not in vLLM mode, one in "
        "vLLM mode is started for this vLLM, state <state_dir>/vllm, and stopped with it)",
    )
    vllm_serve.add_argument(
        "--token",
        help="bearer token (sessions scope) the connector sends to the daemon (default: "
        "$AGENTPARK_TOKEN; none on a loopback daemon without tokens)",
    )
    vllm_serve.add_argument(
        "--no-connector", action="store_true", help="plain vLLM, same environment, no connector"
    )
    vllm_serve.add_argument(
        "--dry-run", action="store_true", help="print the environment and command; start nothing"
    )
    vllm_serve.set_defaults(run=run_vllm_serve, passthrough=True)
    _add_demo(commands, vllm_sub)


def _add_make_model(commands: Commands, sub: Subparsers[argparse.ArgumentParser]) -> None:
    make_model = commands.add(
        sub,
        "make-model",
        help="write a small random-weight Llama checkpoint with a tokenizer and chat "
        "template trained here (no hub), for vLLM (needs agentpark[vllm])",
    )
    make_model.add_argument("dir", type=Path, help="directory to write the model into")
    make_model.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    make_model.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    make_model.add_argument(
        "--heads", type=int, default=2, help="attention heads; hidden/heads >= 32 (default 2)"
    )
    make_model.add_argument("--kv-heads", type=int, help="key/value heads (default: heads)")
    make_model.add_argument("--vocab", type=int, default=2048, help="tokens (default 2048)")
    make_model.add_argument(
        "--max-positions", type=int, default=4096, help="longest context (default 4096)"
    )
    make_model.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    make_model.add_argument("--force", action="store_true", help="write into a non-empty dir")
    make_model.set_defaults(run=run_make_model)


def run_make_model(args: argparse.Namespace) -> int:
    from agentpark.vllm_tools.model import ModelSpec, make_model

    spec = ModelSpec(
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        kv_heads=args.kv_heads,
        vocab=args.vocab,
        max_positions=args.max_positions,
        seed=args.seed,
    )
    make_model(args.dir, spec, force=args.force)
    return 0


def run_vllm_serve(args: argparse.Namespace) -> int:
    from agentpark.cli.common import env_config
    from agentpark.vllm_tools.launch import AutoDaemon, local_daemon_url, serve

    daemon: str | None = None
    auto: AutoDaemon | None = None
    if not args.no_connector:
        if args.daemon:
            daemon = args.daemon  # this one or none: the launcher starts nothing
        else:
            settings = load_settings(args.config)
            daemon = local_daemon_url(settings.server.host, settings.server.port)
            config = args.config or env_config()
            auto = AutoDaemon(settings.state_dir, settings.server.port, config)
    return serve(
        args.model,
        daemon_url=daemon,
        token=args.token or os.environ.get("AGENTPARK_TOKEN") or None,
        extra_args=args.extra_args,
        dry_run=args.dry_run,
        auto=auto,
    )


def _add_demo(commands: Commands, vllm_sub: Subparsers[argparse.ArgumentParser]) -> None:
    demo = commands.add(
        vllm_sub,
        "demo",
        help="start a daemon and a vLLM whose KV cache is too small for a few agents, run "
        "their turns with tool pauses, then the same against plain vLLM; print per turn "
        "the tokens restored, from where, and the time to first token (~2 min)",
    )
    demo.add_argument(
        "model", nargs="?", type=Path, help="model directory (default: make a small one)"
    )
    demo.add_argument("--agents", type=int, default=3, help="agents (default 3)")
    demo.add_argument("--turns", type=int, default=3, help="turns per agent (default 3)")
    demo.add_argument("--seed", type=int, default=4, help="workload seed (default 4)")
    demo.set_defaults(run=run_vllm_demo)


def run_vllm_demo(args: argparse.Namespace) -> int:
    from agentpark.vllm_tools.launch import INSTALL_HINT, vllm_installed

    if min(args.agents, args.turns) < 1 or args.turns < 2:
        raise ConfigError("--agents must be at least 1 and --turns at least 2 (a tool pause)")
    if not vllm_installed():
        raise ConfigError(f"vLLM is not installed in {sys.executable}: {INSTALL_HINT}")
    from agentpark.bench.vllm.demo import demo_spec, run_demo

    try:
        return run_demo(args.model, demo_spec(args.agents, args.turns, args.seed)).code
    except KeyboardInterrupt:
        print("agentpark vllm demo: interrupted; what it started is stopped", file=sys.stderr)
        return 130
