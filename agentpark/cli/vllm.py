"""``agentpark make-model`` and ``agentpark vllm serve``: a small checkpoint for vLLM, and
vLLM's OpenAI server started with agentpark's KV connector (needs agentpark[vllm])."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from agentpark.cli.common import Commands, Subparsers
from agentpark.config import load_settings

__all__ = ["add_vllm_commands", "run_make_model", "run_vllm_serve"]


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
