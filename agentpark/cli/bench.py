"""``agentpark bench transfer | resume | control | connector-control | agents | vllm``: the
flags of each benchmark, and the call into its package (imported only when it runs: the
benches pull in JAX, vLLM's client or rich)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentpark.cli.common import Commands, Subparsers

if TYPE_CHECKING:
    from agentpark.bench.vllm import VllmBenchSpec

__all__ = [
    "add_bench_commands",
    "bench_agents",
    "bench_connector",
    "bench_control",
    "bench_resume",
    "bench_transfer",
    "bench_vllm",
    "parse_size",
    "vllm_spec",
]


def add_bench_commands(commands: Commands, sub: Subparsers[argparse.ArgumentParser]) -> None:
    bench_sub = commands.group(
        sub, "bench", "benchmarks", help="benchmarks (print ratios measured in one run)"
    )
    _add_transfer(commands, bench_sub)
    resume = commands.add(
        bench_sub, "resume", help="resume from dram and shm vs re-prefill from the token log"
    )
    resume.add_argument(
        "--contexts", default="1024,4096,16384", help="comma-separated context lengths (tokens)"
    )
    resume.add_argument("--repeats", type=int, default=3, help="runs per context (median)")
    resume.set_defaults(run=bench_resume)
    control = commands.add(
        bench_sub,
        "control",
        help="get/list/pause/resume//v1/host latency p50/p99 with many sessions, over HTTP",
    )
    control.add_argument("--sessions", type=int, default=10_000, help="sessions to create")
    control.add_argument("--samples", type=int, default=500, help="timed calls per operation")
    control.add_argument("--seed", type=int, default=0, help="which sessions are sampled")
    control.set_defaults(run=bench_control)
    connector = commands.add(
        bench_sub,
        "connector-control",
        help="the vLLM connector's control calls (match, park, restore) p50/p99 over the "
        "daemon's unix socket, with many parked sessions",
    )
    connector.add_argument("--sessions", type=int, default=1000, help="parked sessions")
    connector.add_argument("--samples", type=int, default=2000, help="timed calls per operation")
    connector.add_argument("--tokens", type=int, default=2048, help="tokens per session")
    connector.set_defaults(run=bench_connector)
    _add_agents(commands, bench_sub)
    _add_vllm(commands, bench_sub)
    move = commands.add(
        bench_sub,
        "move",
        help="parked sessions moved between two daemons (drain to a peer): bytes/s against "
        "a plain loopback socket copy of the same bytes, and the drained host's hand-over time",
    )
    move.add_argument("--sessions", type=int, default=8, help="parked sessions per run")
    move.add_argument("--tokens", type=int, default=1024, help="tokens per session")
    move.add_argument("--repeats", type=int, default=3, help="runs (medians)")
    move.add_argument(
        "--kv",
        choices=("llama3-8b", "small"),
        default="llama3-8b",
        help="the sessions' KV layout: llama3-8b (32 layers x 8 KV heads x 128, 2 MiB a "
        "16-token block), small (128 KiB a block: per-session costs more than bytes)",
    )
    move.set_defaults(run=bench_move)


def _add_transfer(commands: Commands, bench_sub: Subparsers[argparse.ArgumentParser]) -> None:
    transfer = commands.add(
        bench_sub, "transfer", help="pause/restore GB/s vs np.copyto at 64 MiB, 256 MiB, 1 GiB"
    )
    transfer.add_argument(
        "--tier", choices=("dram", "shm", "disk"), default="dram", help="tier to park into"
    )
    transfer.add_argument(
        "--sizes", default="64MiB,256MiB,1GiB", help="comma-separated KV sizes per session"
    )
    transfer.add_argument("--repeats", type=int, default=5, help="runs per size (median)")
    transfer.add_argument(
        "--copy-threads",
        type=int,
        default=1,
        help="host_copy's dma.copy_threads; >1 adds ratios to an np.copyto over that many threads",
    )
    transfer.add_argument(
        "--hash-thread",
        action="store_true",
        help="host_copy's dma.hash_thread: the checksum is hashed on a second thread while "
        "the copy runs (the copy-alone table times the other path too)",
    )
    transfer.add_argument(
        "--no-native-copy",
        dest="native_copy",
        action="store_false",
        help="host_copy's dma.native_copy = false: numpy copies and xxhash instead of the "
        "native kernel (the copy-alone tables time both either way, where it is built)",
    )
    transfer.add_argument(
        "--backend",
        choices=("host_copy", "jax_memkind", "tpu_sync"),
        default="host_copy",
        help="DMA backend: jax_memkind moves blocks device <-> pinned_host with "
        "jax.device_put and is judged against a plain pinned device_put of the same bytes "
        "(the GPU check, deploy/gpu-check.sh; on JAX's CPU platform too); tpu_sync runs TPU "
        "Sync's KVCacheManager (agentpark[tpu]; on JAX's CPU platform too); both dram tier "
        "only, --copy-threads 1 only",
    )
    transfer.add_argument(
        "--dir",
        type=Path,
        help="where the tier's temporary directory goes (disk: default the current "
        "directory, never tmpfs; shm: default /dev/shm)",
    )
    transfer.set_defaults(run=bench_transfer)


def _add_agents(commands: Commands, bench_sub: Subparsers[argparse.ArgumentParser]) -> None:
    agents = commands.add(
        bench_sub,
        "agents",
        help="N agents with tool calls on one pool: keep-all, always-recompute, always-park "
        "and the adaptive policy, on a real daemon",
    )
    agents.add_argument("--agents", type=int, default=24, help="concurrent agents (default 24)")
    agents.add_argument("--turns", type=int, default=8, help="turns per agent (default 8)")
    agents.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    agents.add_argument(
        "--time-scale",
        type=float,
        default=0.1,
        help="multiplies every tool duration and the policy's times (default 0.1)",
    )
    agents.add_argument(
        "--pool-ratio",
        type=float,
        default=3.0,
        help="the agents' KV at their final lengths over the pool size (default 3)",
    )
    agents.add_argument(
        "--policies",
        default="keep-all,always-recompute,always-park,adaptive",
        help="comma-separated policies to run, in order",
    )
    agents.add_argument(
        "--plot",
        type=Path,
        default=Path("bench-agents.png"),
        help="PNG of sessions in the pool over time (needs matplotlib: the bench extra)",
    )
    agents.set_defaults(run=bench_agents)


def _add_vllm(commands: Commands, bench_sub: Subparsers[argparse.ArgumentParser]) -> None:
    bench_vllm_parser = commands.add(
        bench_sub,
        "vllm",
        help="agents on one vLLM with too small a KV cache: plain, with agentpark (once per "
        "client), and a roomy plain reference (needs agentpark[vllm])",
    )
    add = bench_vllm_parser.add_argument
    add("--agents", type=int, default=8, help="concurrent agents, or conversations (default 8)")
    add("--turns", type=int, default=5, help="turns per agent or conversation (default 5)")
    add("--seed", type=int, default=0, help="workload seed (default 0)")
    add("--time-scale", type=float, default=0.5, help="multiplies every tool pause (default 0.5)")
    add("--new-tokens", type=int, default=16, help="tokens generated per turn (default 16)")
    add(
        "--blocks",
        type=int,
        help="the small KV cache, in blocks of 128 tokens (default 48: 1.5 contexts of 4096; "
        "shared-prefix and multi-turn 33: the fewest vLLM starts with)",
    )
    add(
        "--max-num-seqs",
        type=int,
        help="vLLM's --max-num-seqs for every run (default: vLLM's); 1 runs one request at "
        "a time, so every run batches alike and each turn must equal the reference's to "
        "the bit (the exactness check)",
    )
    add("--max-model-len", type=int, default=4096, help="vLLM's, and the model's (default 4096)")
    add("--model", type=Path, help="a model dir (default: make-model, 8 layers, hidden 512)")
    add(
        "--runs",
        default="reference,plain,park,pin,adaptive",
        help="comma-separated runs, in order: reference, plain, and agentpark's turn-end "
        "rules park (always park), pin (fixed --pin-ttl-s), adaptive, or agentpark (the "
        "daemon's default) (default reference,plain,park,pin,adaptive)",
    )
    add(
        "--pin-ttl-s",
        type=float,
        default=5.0,
        help="the pin run's fixed pin time-out, seconds as the workload runs (default 5)",
    )
    add(
        "--pin-share",
        type=float,
        help="the daemon's [vllm] pin_share for the runs that pin (default: the daemon's)",
    )
    add(
        "--repeats",
        type=int,
        default=1,
        help="every run this many times on the same workload; then medians and ranges (default 1)",
    )
    add("--save", type=Path, help="write every repeat's turns to this JSON file")
    add(
        "--client",
        default="agentpark",
        help="comma-separated: how the client names its session, one agentpark run each: "
        "agentpark (kv_transfer_params.agentpark.session_id), session-id (only the "
        "X-Session-ID header, as vLLM's multi-turn benchmark), none (only the messages); "
        "default agentpark",
    )
    add(
        "--workload",
        choices=("agents", "shared-prefix", "multi-turn"),
        default="agents",
        help="agents: tool-calling agents, a system prompt each; shared-prefix: the same, "
        "sharing one system prompt of --system-tokens; multi-turn: conversations shaped like "
        "vLLM's benchmarks/multi_turn (default agents)",
    )
    add(
        "--system-tokens",
        type=int,
        default=1024,
        help="shared-prefix: the system prompt all agents share, tokens (default 1024)",
    )
    _add_multi_turn(add)
    bench_vllm_parser.set_defaults(run=bench_vllm)


def _add_multi_turn(add: Callable[..., Any]) -> None:
    """The multi-turn workload's shape; vLLM's generate_multi_turn.json in brackets."""
    add(
        "--common-prefix-tokens",
        type=int,
        default=256,
        help="multi-turn: the prefix every conversation starts with (default 256 [500])",
    )
    add(
        "--conversation-prefix-tokens",
        type=int,
        default=1000,
        help="multi-turn: each conversation's own prefix, the average of a log-normal "
        "capped at twice it (default 1000 [1000, capped at 5000])",
    )
    add(
        "--user-tokens",
        default="120,160",
        help="multi-turn: MIN,MAX tokens of each user turn (default 120,160 [the same])",
    )
    add(
        "--answer-tokens",
        default="24,40",
        help="multi-turn: MIN,MAX tokens of each answer the client replays (default 24,40 "
        "[80,120])",
    )
    add(
        "--concurrency",
        type=int,
        default=2,
        help="multi-turn: clients sending at once, each taking the next conversation in line "
        "(default 2 [--num-clients 2])",
    )


def bench_transfer(args: argparse.Namespace) -> int:
    from agentpark.bench.transfer import run_transfer_bench

    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    return run_transfer_bench(
        sizes,
        repeats=args.repeats,
        tier=args.tier,
        directory=args.dir,
        copy_threads=args.copy_threads,
        backend=args.backend,
        hash_thread=args.hash_thread,
        native_copy=args.native_copy,
    )


def bench_resume(args: argparse.Namespace) -> int:
    from agentpark.bench.resume import run_resume_bench

    try:
        contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    except ValueError:
        raise SystemExit(f"agentpark: cannot read --contexts {args.contexts!r}") from None
    return run_resume_bench(contexts, repeats=args.repeats)


def bench_control(args: argparse.Namespace) -> int:
    from agentpark.bench.control import run_control_bench

    return run_control_bench(args.sessions, samples=args.samples, seed=args.seed)


def bench_connector(args: argparse.Namespace) -> int:
    from agentpark.bench.connector import run_connector_bench

    return run_connector_bench(args.sessions, samples=args.samples, tokens=args.tokens)


def bench_agents(args: argparse.Namespace) -> int:
    from agentpark.bench.agents import WorkloadSpec, run_agents_bench

    spec = WorkloadSpec(
        agents=args.agents,
        turns=args.turns,
        seed=args.seed,
        time_scale=args.time_scale,
        pool_ratio=args.pool_ratio,
    )
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    return run_agents_bench(spec, policies=policies, plot=args.plot)


def bench_vllm(args: argparse.Namespace) -> int:
    from agentpark.bench.vllm import run_vllm_bench

    return run_vllm_bench(
        vllm_spec(args), runs=_names(args.runs), model=args.model, save_to=args.save
    )


def vllm_spec(args: argparse.Namespace) -> VllmBenchSpec:
    """The bench's spec from ``agentpark bench vllm``'s flags (checked when it runs)."""
    from agentpark.bench.vllm import VllmBenchSpec

    return VllmBenchSpec(
        agents=args.agents,
        turns=args.turns,
        seed=args.seed,
        time_scale=args.time_scale,
        new_tokens=args.new_tokens,
        blocks=args.blocks,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        clients=_names(args.client),
        workload=args.workload,
        system_tokens=args.system_tokens,
        common_prefix_tokens=args.common_prefix_tokens,
        conversation_prefix_tokens=args.conversation_prefix_tokens,
        user_tokens=_span("--user-tokens", args.user_tokens),
        answer_tokens=_span("--answer-tokens", args.answer_tokens),
        concurrency=args.concurrency,
        pin_ttl_s=args.pin_ttl_s,
        pin_share=args.pin_share,
        repeats=args.repeats,
    )


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _span(flag: str, text: str) -> tuple[int, int]:
    """``MIN,MAX`` as two ints; exits with a message for anything else."""
    try:
        low, high = (int(n) for n in text.split(","))
    except ValueError:
        raise SystemExit(
            f"agentpark: cannot read {flag} {text!r} (MIN,MAX, e.g. 120,160)"
        ) from None
    return low, high


def parse_size(text: str) -> int:
    """``64MiB``, ``1GiB``, ... as bytes; exits with a message for anything else."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    try:
        return int(TypeAdapter(ByteSize).validate_python(text.strip()))
    except ValidationError:
        raise SystemExit(f"agentpark: cannot read size {text!r} (e.g. 64MiB, 1GiB)") from None


def bench_move(args: argparse.Namespace) -> int:
    from agentpark.bench.move import KV_LAYOUTS, run_move_bench

    model = KV_LAYOUTS[args.kv]
    run_move_bench(sessions=args.sessions, tokens=args.tokens, repeats=args.repeats, model=model)
    return 0
