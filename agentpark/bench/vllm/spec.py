"""What ``agentpark bench vllm`` runs: the runs, the clients, the workloads, the tools'
pauses, the workload and model sizes, and the KV a token takes in the bench's model."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = [
    "BLOCK_SIZE",
    "CLIENTS",
    "DEFAULT_RUNS",
    "RUNS",
    "TOOLS",
    "TURN_ENDS",
    "WORKLOADS",
    "VllmBenchSpec",
    "daemon_env",
    "kv_bytes_per_token",
]

# Runs with agentpark (a daemon behind the connector) -> the daemon's [vllm] turn_end
# (AGENTPARK_VLLM__TURN_END): park = always park (agentpark before pins), pin = pin
# every turn for a fixed TTL, drop the rest, never park (Continuum's rule,
# spec.pin_ttl_s), adaptive = keep (pin) / park / drop chosen per turn; agentpark =
# whatever the daemon's default is.
TURN_ENDS: dict[str, str | None] = {
    "park": "park",
    "pin": "pin",
    "adaptive": "adaptive",
    "agentpark": None,
}
RUNS = ("reference", "plain", *TURN_ENDS)
DEFAULT_RUNS = ("reference", "plain", "park", "pin", "adaptive")
BLOCK_SIZE = 128  # vLLM's CPU KV block size (tokens)

# How the driven OpenAI client names its session: agentpark's own kv_transfer_params,
# only the X-Session-ID header (vLLM's multi-turn benchmark with --send-conversation-id),
# or nothing but the messages (an unchanged OpenAI client).
CLIENTS = ("agentpark", "session-id", "none")
# agents: tool-calling agents, each with its own system prompt; shared-prefix: the same,
# all sharing one system prompt of ``system_tokens``; multi-turn: conversations shaped
# like vLLM's benchmarks/multi_turn (common prefix, per-conversation prefix, user turns).
WORKLOADS = ("agents", "shared-prefix", "multi-turn")

# Tool -> (median pause in seconds before time_scale, log-normal sigma). Tools take
# seconds; a person approving a step takes longer (ask_human: 12 s at the default
# time_scale 0.5, over twice pin-only's 5 s TTL), which is where a fixed TTL drops a
# session's KV that a pin sized to the pause (or a park) would have kept.
TOOLS: dict[str, tuple[float, float]] = {
    "web_search": (6.0, 0.5),
    "run_tests": (3.0, 0.4),
    "read_file": (1.0, 0.3),
    "ask_human": (24.0, 0.5),
}


@dataclass(frozen=True)
class VllmBenchSpec:
    agents: int = 8  # agents, or conversations of the multi-turn workload
    turns: int = 5
    seed: int = 0
    context: tuple[int, int] = (1000, 2000)  # first prompt, tokens (agents)
    result: tuple[int, int] = (150, 500)  # each tool result, tokens
    new_tokens: int = 16
    time_scale: float = 0.5
    blocks: int | None = None  # the small KV cache; None: see small_blocks
    layers: int = 8
    hidden: int = 512
    heads: int = 8
    max_model_len: int = 4096
    reference_kv_gib: int = 2
    # vLLM's --max-num-seqs for every run; 1: the runs batch alike (the exactness check).
    max_num_seqs: int | None = None
    # One agentpark run per client, in this order; plain and reference send messages only.
    clients: tuple[str, ...] = ("agentpark",)
    workload: str = "agents"
    system_tokens: int = 1024  # shared-prefix: the one system prompt every agent sends
    task: tuple[int, int] = (64, 192)  # shared-prefix: each agent's own task, tokens
    # multi-turn, vLLM's generate_multi_turn.json scaled down (there: 500, ~1000 lognormal
    # up to 5000, 120-160, 80-120, 12-18 messages, 2 clients).
    common_prefix_tokens: int = 256
    conversation_prefix_tokens: int = 1000  # the average of a log-normal, capped at 2x
    user_tokens: tuple[int, int] = (120, 160)
    answer_tokens: tuple[int, int] = (24, 40)
    concurrency: int = 2  # multi-turn: clients sending at once (vLLM's --num-clients)
    # The pin run's fixed time-out (s, as the workload runs: pauses already time-scaled):
    # Continuum's rule, one TTL for every tool. 5 s covers the median pause of three of the
    # four tools at the default time_scale 0.5 (0.5, 1.5, 3 s) and not ask_human's (12 s).
    pin_ttl_s: float = 5.0
    # The agents' tools (TOOLS by default; the demo's are shorter, so it ends in minutes).
    tools: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(TOOLS))
    # The daemon's [vllm] pin_share for the runs that pin (None: the daemon's default);
    # ``--pin-share`` sweeps it (how the default was chosen: docs/benchmarks.md).
    pin_share: float | None = None
    repeats: int = 1  # every run this many times on the same workload: the noise

    @property
    def exact(self) -> bool:
        """Whether every run batches alike, so turns compare to the bit: with one request
        at a time. Otherwise the servers batch the same requests differently and even the
        first turns (nothing cached or restored) may differ in their last bits."""
        return self.max_num_seqs == 1

    def small_blocks(self) -> int:
        """The small KV cache in blocks: ``blocks``, else room for about 1.5 agents at their
        longest, or the fewest vLLM starts with: multi-turn conversations are shorter than
        --max-model-len (vLLM's own shape: more of them than the cache holds), and vLLM's
        prefix cache holds a shared system prompt once too (measured: 4 agents sharing 1024
        tokens fit in 48 blocks, plain computing what the roomy reference did)."""
        if self.blocks is not None:
            return self.blocks
        if self.workload != "agents":
            return self.fewest_blocks()
        return max(self.fewest_blocks(), math.ceil(1.5 * self.max_model_len / BLOCK_SIZE))

    def fewest_blocks(self) -> int:
        """The smallest KV cache vLLM starts with: one request of --max-model-len, and the
        block it keeps aside (measured on vLLM 0.32: 32 blocks of 128 refuse 4096, 3968 fit)."""
        return math.ceil(self.max_model_len / BLOCK_SIZE) + 1

    def problems(self) -> list[str]:
        """What is wrong with these flags, worded for the command line (empty: none)."""
        wrong = []
        unknown = [c for c in self.clients if c not in CLIENTS]
        if unknown or not self.clients:
            wrong.append(f"unknown clients {unknown}; choose from {CLIENTS}")
        if len(set(self.clients)) != len(self.clients):
            wrong.append(f"a client named twice in {list(self.clients)}")
        if self.workload not in WORKLOADS:
            wrong.append(f"unknown workload {self.workload!r}; choose from {WORKLOADS}")
        if self.agents < 1 or self.turns < 1 or self.concurrency < 1:
            wrong.append("--agents, --turns and --concurrency must be at least 1")
        for name, (low, high) in (
            ("--user-tokens", self.user_tokens),
            ("--answer-tokens", self.answer_tokens),
        ):
            if not 0 < low <= high:
                wrong.append(f"{name} must be MIN,MAX with 0 < MIN <= MAX, got {low},{high}")
        if self.pin_share is not None and not 0 <= self.pin_share <= 1:
            wrong.append(f"--pin-share must be in [0, 1], got {self.pin_share}")
        if not 1 <= self.repeats <= 20:
            wrong.append(f"--repeats must be in [1, 20], got {self.repeats}")
        if not 0 < self.pin_ttl_s <= 86_400:
            wrong.append(f"--pin-ttl-s must be in (0, 86400], got {self.pin_ttl_s}")
        if self.workload == "shared-prefix" and self.system_tokens < BLOCK_SIZE:
            wrong.append(f"--system-tokens must be at least one block ({BLOCK_SIZE})")
        if self.blocks is not None and self.blocks < self.fewest_blocks():
            wrong.append(
                f"--blocks {self.blocks} is too small for --max-model-len {self.max_model_len}: "
                f"vLLM starts with {self.fewest_blocks()} blocks of {BLOCK_SIZE} or more"
            )
        return wrong


def daemon_env(run: str, spec: VllmBenchSpec) -> dict[str, str]:
    """The daemon's environment for an agentpark run: its turn-end rule (none for the
    ``agentpark`` run: the daemon's default), the pin run's fixed TTL, and the pinned
    share when one is given."""
    mode = TURN_ENDS.get(run)
    if mode is None:
        share = spec.pin_share
        return {} if share is None else {"AGENTPARK_VLLM__PIN_SHARE": repr(float(share))}
    env = {"AGENTPARK_VLLM__TURN_END": mode}
    if mode == "pin":
        env["AGENTPARK_VLLM__PIN_TTL_S"] = repr(float(spec.pin_ttl_s))
    if mode != "park" and spec.pin_share is not None:
        env["AGENTPARK_VLLM__PIN_SHARE"] = repr(float(spec.pin_share))
    return env


def kv_bytes_per_token(spec: VllmBenchSpec) -> int:
    head_dim = spec.hidden // spec.heads
    return spec.layers * 2 * spec.heads * head_dim * 2  # K and V, bfloat16
