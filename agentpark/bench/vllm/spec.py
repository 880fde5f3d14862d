"""What ``agentpark bench vllm`` runs: the runs, the tools' pauses, the workload and model
sizes, and the KV a token takes in the bench's model."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BLOCK_SIZE", "RUNS", "TOOLS", "VllmBenchSpec", "kv_bytes_per_token"]

RUNS = ("reference", "plain", "agentpark")
BLOCK_SIZE = 128  # vLLM's CPU KV block size (tokens)

# Tool -> (median pause in seconds before time_scale, log-normal sigma).
TOOLS: dict[str, tuple[float, float]] = {
    "web_search": (6.0, 0.5),
    "run_tests": (3.0, 0.4),
    "read_file": (1.0, 0.3),
    "ask_human": (12.0, 0.6),
}


@dataclass(frozen=True)
class VllmBenchSpec:
    agents: int = 6
    turns: int = 4
    seed: int = 0
    context: tuple[int, int] = (1000, 2000)  # first prompt, tokens
    result: tuple[int, int] = (150, 500)  # each tool result, tokens
    new_tokens: int = 16
    time_scale: float = 0.5
    blocks: int | None = None  # the small KV cache; None: ~1.5 agents at their longest
    layers: int = 8
    hidden: int = 512
    heads: int = 8
    max_model_len: int = 4096
    reference_kv_gib: int = 2
    # vLLM's --max-num-seqs for every run; 1: the runs batch alike (the exactness check).
    max_num_seqs: int | None = None

    @property
    def exact(self) -> bool:
        """Whether every run batches alike, so turns compare to the bit: with one request
        at a time. Otherwise the servers batch the same requests differently and even the
        first turns (nothing cached or restored) may differ in their last bits."""
        return self.max_num_seqs == 1


def kv_bytes_per_token(spec: VllmBenchSpec) -> int:
    head_dim = spec.hidden // spec.heads
    return spec.layers * 2 * spec.heads * head_dim * 2  # K and V, bfloat16
