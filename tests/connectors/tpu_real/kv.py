"""KV caches shaped like tpu-inference's, a runner-like object, and a donated forward step."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

NUM_BLOCKS = 32
BLOCK = 16
KV_HEADS = 2
HEAD_DIM = 64
LAYERS = 3
SHAPE = (NUM_BLOCKS, BLOCK, 2 * KV_HEADS, HEAD_DIM)  # [blocks, block_size, 2*kv_heads, head_dim]
BLOCK_NBYTES = LAYERS * BLOCK * 2 * KV_HEADS * HEAD_DIM * 2  # bfloat16, every layer
HOST_BLOCKS = 16
HOST_BYTES = HOST_BLOCKS * BLOCK_NBYTES
MODEL_UID = "vllm:tiny-tpu:jax.bfloat16:0123456789abcdef"


class Runner:
    """What the TPU worker needs of tpu-inference's TPUModelRunner: its ``kv_caches`` list."""

    def __init__(self, kv_caches: list[jax.Array]) -> None:
        self.kv_caches = kv_caches


def make_caches(seed: int) -> list[jax.Array]:
    """Random bfloat16 KV caches, one per layer (every bit pattern but NaNs is possible)."""
    key = jax.random.PRNGKey(seed)
    return [
        jax.random.normal(jax.random.fold_in(key, layer), SHAPE, dtype=jnp.bfloat16)
        for layer in range(LAYERS)
    ]


@functools.partial(jax.jit, donate_argnums=0)
def _forward(caches: list[jax.Array], ids: jax.Array, rows: jax.Array) -> list[jax.Array]:
    return [c.at[ids].set(rows) for c in caches]


def forward(runner: Runner, ids: list[int], seed: int) -> None:
    """A model step as tpu-inference runs it: the caches are donated and the runner's list
    is REASSIGNED to the step's outputs (new arrays over the same device memory)."""
    rows = jax.random.normal(jax.random.PRNGKey(seed), (len(ids), *SHAPE[1:]), jnp.bfloat16)
    runner.kv_caches = _forward(runner.kv_caches, jnp.asarray(ids, jnp.int32), rows)


@jax.jit
def _gather(cache: jax.Array, ids: jax.Array) -> jax.Array:
    return cache[ids]


def blocks_of(runner: Runner, ids: list[int]) -> list[np.ndarray]:
    """Blocks ``ids`` of every layer as the next forward reads them (through XLA), as bits."""
    index = jnp.asarray(ids, jnp.int32)
    return [np.asarray(_gather(c, index)).view(np.uint16) for c in runner.kv_caches]


def bits(runner: Runner) -> list[np.ndarray]:
    """Every layer's whole cache, as bits (a copy)."""
    return [np.asarray(c).view(np.uint16).copy() for c in runner.kv_caches]
