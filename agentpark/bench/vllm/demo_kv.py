"""The KV space of ``agentpark vllm demo``, chosen for its workload before vLLM starts.

vLLM refuses to start when ``--num-gpu-blocks-override`` cannot hold one request of
``--max-model-len`` (a 2-minute start lost for nothing), and with room for every session it
evicts nothing, so agentpark restores nothing and the demo shows no effect. The rule here:

- ``--max-model-len``: the longest prompt of the workload, its new tokens and a margin for
  the chat template (``prompt_tokens`` is an estimate), in whole blocks;
- ``--num-gpu-blocks-override``: the fewest blocks vLLM starts with for that length
  (``VllmBenchSpec.fewest_blocks``: one longest request and the block vLLM keeps aside);

then checked: every first prompt holds a whole block (else the first answers are only
"kept: no whole block of KV to park"), the sessions' first prompts together need more
blocks than the cache has (so the second round of turns finds some evicted), and the model
takes that many positions."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentpark.bench.vllm.spec import BLOCK_SIZE, VllmBenchSpec

__all__ = ["TEMPLATE_MARGIN", "KvChoice", "choose_kv", "model_shape"]

# Tokens added to the estimated longest prompt: the estimate counts 8 per message for the
# chat template's markers; a template with longer ones still fits.
TEMPLATE_MARGIN = 64


@dataclass(frozen=True)
class KvChoice:
    max_model_len: int
    blocks: int  # --num-gpu-blocks-override
    first_blocks: int  # whole blocks of all sessions' first prompts together
    problems: tuple[str, ...] = ()  # why the demo would show nothing (empty: none)


def choose_kv(
    first_prompts: Sequence[int],
    last_prompts: Sequence[int],
    new_tokens: int,
    model_positions: int | None,
) -> KvChoice:
    """vLLM's KV space for sessions whose prompts take ``first_prompts`` tokens at their
    first turn and ``last_prompts`` at their last; ``model_positions`` is the model's
    longest context (None: unknown)."""
    longest = max(last_prompts) + new_tokens + TEMPLATE_MARGIN
    max_model_len = math.ceil(longest / BLOCK_SIZE) * BLOCK_SIZE
    blocks = VllmBenchSpec(max_model_len=max_model_len).fewest_blocks()
    first_blocks = sum(tokens // BLOCK_SIZE for tokens in first_prompts)
    problems = []
    if min(first_prompts) < BLOCK_SIZE:
        problems.append(
            f"a first prompt of {min(first_prompts)} tokens holds no whole block of "
            f"{BLOCK_SIZE}: its turn could not be parked"
        )
    if first_blocks <= blocks:
        problems.append(
            f"the sessions' first prompts take {first_blocks} blocks, the KV cache "
            f"{blocks}: nothing would be evicted (more agents, or longer prompts)"
        )
    if model_positions is not None and max_model_len > model_positions:
        problems.append(
            f"the longest prompt needs --max-model-len {max_model_len}, more than the "
            f"model's {model_positions} positions"
        )
    return KvChoice(max_model_len, blocks, first_blocks, tuple(problems))


def model_shape(model: Path) -> tuple[int, int, int, int | None]:
    """(layers, key/value heads, head dim, positions) from the model's ``config.json``:
    what a token's KV takes (the servers run bfloat16), and its longest context."""
    config = json.loads((model / "config.json").read_text())
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    positions = config.get("max_position_embeddings")
    layers = int(config["num_hidden_layers"])
    return layers, kv_heads, head_dim, None if positions is None else int(positions)
