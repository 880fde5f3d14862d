"""Reference engine: a small decoder-only transformer in JAX over a paged KV pool.

It exists so the daemon runs end to end anywhere and so pause/resume is checked to the bit:
the same tokens fed the same way give bit-identical logits whatever block ids hold the KV.

Layout and data path (why it is built this way):

* ONE fused pool array ``[num_blocks, n_layers, 2, block_size, n_kv_heads, head_dim]`` (K at
  index 0 of axis 2, V at 1), so a block is one contiguous row and the DMA core copies a
  session with one gather. Values are bfloat16 *bits* stored as uint16: on CPU a scatter into a
  bfloat16 array converts the whole pool to f32 and back, a uint16 one is updated in place.
  Compute is float32; K/V are rounded to bfloat16 when stored.
* ``extend`` runs one jitted step per chunk with the pool donated, so writes are in place. A
  step writes the chunk's K/V into the pool first, then gathers the whole context back through
  the block table and attends with a causal mask; a prefill chunk and a one-token decode step
  thus read exactly the same (stored, rounded) data.
* Token counts are padded to a bucket in :data:`PREFILL_BUCKETS` and inputs longer than
  :data:`MAX_CHUNK` are split into chunks of that size from the start, always the same way for
  the same ``(start_pos, length)``. Padded tokens are scattered to an out-of-range block id
  with ``mode="drop"`` (no write) and masked out as keys; masked values are zeroed, so whatever
  bytes sit in unused table slots or other sessions' blocks cannot change a result.
* Jitted functions are cached per ``(ModelSpec, PoolSpec)`` at module level, so every engine
  with the same specs in a process shares one compile cache.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from agentpark.blocks import ArraySpec, BlockAllocator, PoolGeometry
from agentpark.engine import tokenizer

__all__ = ["MAX_CHUNK", "PREFILL_BUCKETS", "ModelSpec", "PoolSpec", "ReferenceEngine"]

PREFILL_BUCKETS: tuple[int, ...] = (1, 16, 64, 256)
"""Token counts a step is compiled for; a chunk is padded up to the smallest that fits."""
MAX_CHUNK = PREFILL_BUCKETS[-1]
"""Longest chunk one step runs; longer inputs are split into chunks of this size."""

_LAYOUT_VERSION = "agentpark-reference/1"  # bump when the pool layout or the math changes
_ROPE_THETA = 10_000.0
_NORM_EPS = 1e-6
_MASKED_SCORE = float(np.finfo(np.float32).min)
_HIGHEST = lax.Precision.HIGHEST  # no TF32/bf16 matmul shortcuts on accelerators

Params = dict[str, Any]


@dataclass(frozen=True)
class ModelSpec:
    """Model shape and weight seed. The vocabulary is the byte tokenizer's (256)."""

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    ffn_dim: int = 128
    max_seq_len: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.name != "seed" and getattr(self, f.name) <= 0:
                raise ValueError(f"ModelSpec.{f.name} must be positive")
        if self.seed < 0:
            raise ValueError("ModelSpec.seed must be >= 0")
        if self.n_heads % self.n_kv_heads:
            raise ValueError("n_heads must be a multiple of n_kv_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (RoPE rotates pairs)")


@dataclass(frozen=True)
class PoolSpec:
    """Paged KV pool size."""

    block_size: int = 16  # tokens per block
    num_blocks: int = 256

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.num_blocks <= 0:
            raise ValueError("PoolSpec.block_size and num_blocks must be positive")


# --------------------------------------------------------------------------------------------
# Weights


def _init_params(model: ModelSpec) -> Params:
    """Seeded random float32 weights (threefry: the same bits in every process)."""
    d, hd, v = model.d_model, model.head_dim, tokenizer.VOCAB_SIZE
    root = jax.random.key(model.seed)
    k_embed, k_head, *k_layers = jax.random.split(root, 2 + model.n_layers)

    def dense(key: jax.Array, fan_in: int, fan_out: int) -> jax.Array:
        return jax.random.normal(key, (fan_in, fan_out), jnp.float32) / math.sqrt(fan_in)

    layers = []
    for key in k_layers:
        kq, kk, kv, ko, kg, ku, kd = jax.random.split(key, 7)
        layers.append(
            {
                "attn_norm": jnp.ones((d,), jnp.float32),
                "wq": dense(kq, d, model.n_heads * hd),
                "wk": dense(kk, d, model.n_kv_heads * hd),
                "wv": dense(kv, d, model.n_kv_heads * hd),
                "wo": dense(ko, model.n_heads * hd, d),
                "mlp_norm": jnp.ones((d,), jnp.float32),
                "w_gate": dense(kg, d, model.ffn_dim),
                "w_up": dense(ku, d, model.ffn_dim),
                "w_down": dense(kd, model.ffn_dim, d),
            }
        )
    return {
        "embed": jax.random.normal(k_embed, (v, d), jnp.float32),
        "layers": layers,
        "final_norm": jnp.ones((d,), jnp.float32),
        "lm_head": dense(k_head, d, v),  # untied: keeps logits at unit scale
    }


@functools.lru_cache(maxsize=8)
def _params_for(model: ModelSpec) -> Params:
    """Weights shared by every engine with this spec (they are immutable)."""
    params: Params = jax.jit(_init_params, static_argnums=0)(model)
    return params


# --------------------------------------------------------------------------------------------
# Model math


def _mm(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.matmul(a, b, precision=_HIGHEST)


def _rms_norm(x: jax.Array, weight: jax.Array) -> jax.Array:
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + _NORM_EPS) * weight


def _rope(x: jax.Array, pos: jax.Array) -> jax.Array:
    """Rotary embedding (half-split form); x is [T, heads, head_dim], pos is [T]."""
    half = x.shape[-1] // 2
    inv_freq = _ROPE_THETA ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = pos.astype(jnp.float32)[:, None] * inv_freq[None, :]  # [T, half]
    cos, sin = jnp.cos(angles)[:, None, :], jnp.sin(angles)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def _to_bits(x: jax.Array) -> jax.Array:
    """float32 -> bfloat16 (round to nearest even) -> its uint16 bits, for storage."""
    return lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)


def _from_bits(bits: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(bits, jnp.bfloat16).astype(jnp.float32)


def _attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, model: ModelSpec
) -> jax.Array:
    """Grouped-query attention. q [T, H, hd], k/v [S, KVH, hd], mask [T, S] -> [T, H*hd]."""
    t, hd = q.shape[0], model.head_dim
    group = model.n_heads // model.n_kv_heads
    q = q.reshape(t, model.n_kv_heads, group, hd)
    scores = jnp.einsum("tkgd,skd->kgts", q, k, precision=_HIGHEST) / math.sqrt(hd)
    # A finite floor, not -inf: a fully masked (padded) query row stays NaN-free.
    scores = jnp.where(mask[None, None], scores, _MASKED_SCORE)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("kgts,skd->tkgd", probs, v, precision=_HIGHEST)
    return out.reshape(t, model.n_heads * hd)


def _step(
    params: Params,
    pool: jax.Array,
    tokens: jax.Array,
    start_pos: jax.Array,
    num_valid: jax.Array,
    block_table: jax.Array,
    *,
    model: ModelSpec,
    pool_spec: PoolSpec,
) -> tuple[jax.Array, jax.Array]:
    """Run one padded chunk: returns (updated pool, float32 logits of the last valid token).

    tokens [T] int32 (the first ``num_valid`` are real), block_table [max_blocks] int32.
    """
    t = tokens.shape[0]
    bs, max_blocks = pool_spec.block_size, block_table.shape[0]
    hd = model.head_dim

    idx = jnp.arange(t, dtype=jnp.int32)
    pos = start_pos + idx  # [T]
    valid = idx < num_valid
    end = start_pos + num_valid  # positions < end hold real K/V once this chunk is written

    # Destination of each token's K/V; padded tokens go to an out-of-range block and are dropped.
    table_idx = jnp.minimum(pos // bs, max_blocks - 1)
    dst_block = jnp.where(valid, block_table[table_idx], pool_spec.num_blocks)
    dst_off = pos % bs

    key_pos = jnp.arange(max_blocks * bs, dtype=jnp.int32)  # [S]
    key_live = key_pos < end
    # Causal; key_live only matters for padded query rows (keeps them clean, they are dropped).
    mask = (key_pos[None, :] <= pos[:, None]) & key_live[None, :]  # [T, S]

    x = params["embed"][tokens]  # [T, D]
    for layer_idx, layer in enumerate(params["layers"]):
        h = _rms_norm(x, layer["attn_norm"])
        q = _rope(_mm(h, layer["wq"]).reshape(t, model.n_heads, hd), pos)
        k = _rope(_mm(h, layer["wk"]).reshape(t, model.n_kv_heads, hd), pos)
        v = _mm(h, layer["wv"]).reshape(t, model.n_kv_heads, hd)

        # Write first, then read the context back from the pool: one data path for all T.
        pool = pool.at[dst_block, layer_idx, 0, dst_off].set(_to_bits(k), mode="drop")
        pool = pool.at[dst_block, layer_idx, 1, dst_off].set(_to_bits(v), mode="drop")
        ctx = _from_bits(pool[block_table, layer_idx])  # [max_blocks, 2, bs, KVH, hd]
        keys = ctx[:, 0].reshape(max_blocks * bs, model.n_kv_heads, hd)
        values = ctx[:, 1].reshape(max_blocks * bs, model.n_kv_heads, hd)
        # Zero dead slots so stray bytes (even NaN bits) contribute exactly 0 * 0.
        values = jnp.where(key_live[:, None, None], values, 0.0)

        x = x + _mm(_attention(q, keys, values, mask, model), layer["wo"])
        h = _rms_norm(x, layer["mlp_norm"])
        x = x + _mm(jax.nn.silu(_mm(h, layer["w_gate"])) * _mm(h, layer["w_up"]), layer["w_down"])

    last = lax.dynamic_index_in_dim(x, num_valid - 1, axis=0, keepdims=False)
    logits = _mm(_rms_norm(last, params["final_norm"]), params["lm_head"])
    return pool, logits


@functools.lru_cache(maxsize=32)
def _step_fn(model: ModelSpec, pool_spec: PoolSpec) -> Any:
    """The jitted, pool-donating step for one spec pair (shared by all engines in a process)."""
    return jax.jit(
        functools.partial(_step, model=model, pool_spec=pool_spec),
        donate_argnums=1,
    )


def _bucket(n: int) -> int:
    return next(b for b in PREFILL_BUCKETS if b >= n)


def _model_uid(model: ModelSpec, pool: PoolSpec) -> str:
    payload = json.dumps(
        {
            "layout": _LAYOUT_VERSION,
            "model": dataclasses.asdict(model),
            "pool": dataclasses.asdict(pool),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# Engine


class ReferenceEngine:
    """The reference :class:`~agentpark.engine.base.EngineAdapter` implementation."""

    def __init__(self, model: ModelSpec | None = None, pool: PoolSpec | None = None) -> None:
        self.model = model if model is not None else ModelSpec()
        self.pool_spec = pool if pool is not None else PoolSpec()
        m, p = self.model, self.pool_spec
        self.vocab_size = tokenizer.VOCAB_SIZE
        self.max_seq_len = m.max_seq_len
        self.max_blocks_per_seq = -(-m.max_seq_len // p.block_size)
        block_shape = (m.n_layers, 2, p.block_size, m.n_kv_heads, m.head_dim)
        self.geometry = PoolGeometry(
            num_blocks=p.num_blocks,
            block_size=p.block_size,
            arrays=(ArraySpec(block_shape, "uint16"),),
        )
        self.allocator = BlockAllocator(p.num_blocks)
        self.lock = threading.RLock()
        self.model_uid = _model_uid(m, p)
        self._params = _params_for(m)
        # The seed only changes weight values, not the graph: share one compile across seeds.
        self._step = _step_fn(dataclasses.replace(m, seed=0), p)
        self._pool = jnp.zeros((p.num_blocks, *block_shape), jnp.uint16)

    # -- pool access (DMA core) -------------------------------------------------------------

    def kv_pool(self) -> list[jax.Array]:
        """The live pool array. On CPU ``np.asarray`` of it is a zero-copy view; drop such views
        before the next ``extend``, or donation silently falls back to copying the whole pool."""
        with self.lock:
            return [self._pool]

    def set_kv_pool(self, arrays: list[jax.Array]) -> None:
        if len(arrays) != 1:
            raise ValueError(f"expected 1 pool array, got {len(arrays)}")
        (arr,) = arrays
        expected = (self.geometry.num_blocks, *self.geometry.arrays[0].block_shape)
        if tuple(arr.shape) != expected or arr.dtype != jnp.uint16:
            raise ValueError(f"pool must be uint16{list(expected)}, got {arr.dtype}{arr.shape}")
        with self.lock:
            self._pool = arr

    # -- tokens -----------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        return tokenizer.encode(text)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return tokenizer.decode(tokens)

    def blocks_for(self, num_tokens: int) -> int:
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return -(-num_tokens // self.geometry.block_size)

    # -- compute ----------------------------------------------------------------------------

    def extend(
        self, block_table: Sequence[int], start_pos: int, tokens: Sequence[int]
    ) -> np.ndarray:
        """See :meth:`agentpark.engine.base.EngineAdapter.extend`."""
        tok = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = int(tok.size)
        if n == 0:
            raise ValueError("extend needs at least one token")
        if start_pos < 0:
            raise ValueError(f"start_pos must be >= 0, got {start_pos}")
        end = start_pos + n
        if end > self.max_seq_len:
            raise ValueError(f"sequence of {end} tokens exceeds max_seq_len {self.max_seq_len}")
        needed = self.blocks_for(end)
        if len(block_table) < needed:
            raise ValueError(
                f"{end} tokens need {needed} blocks, block_table has {len(block_table)}"
            )
        used = np.asarray(block_table[:needed], dtype=np.int64)
        if used.size and (used.min() < 0 or used.max() >= self.geometry.num_blocks):
            raise ValueError(f"block ids must be in [0, {self.geometry.num_blocks})")
        if np.unique(used).size != used.size:
            raise ValueError("block_table repeats a block id")
        if tok.min() < 0 or tok.max() >= self.vocab_size:
            raise ValueError(f"token ids must be in [0, {self.vocab_size})")

        # Only the blocks the sequence can reach; the rest is 0 (never read: masked as dead keys).
        table = np.zeros(self.max_blocks_per_seq, dtype=np.int32)
        table[:needed] = used
        logits = None
        with self.lock:
            for off in range(0, n, MAX_CHUNK):
                chunk = tok[off : off + MAX_CHUNK]
                padded = np.zeros(_bucket(chunk.size), dtype=np.int32)
                padded[: chunk.size] = chunk
                self._pool, logits = self._step(
                    self._params,
                    self._pool,
                    padded,
                    np.int32(start_pos + off),
                    np.int32(chunk.size),
                    table,
                )
        return np.array(logits, dtype=np.float32)

    def warmup(self) -> None:
        """Compile T=1 (decode) and the smallest prefill bucket; writes nothing (0 valid)."""
        table = np.zeros(self.max_blocks_per_seq, dtype=np.int32)
        with self.lock:
            for t in (1, PREFILL_BUCKETS[1]):
                self._pool, _ = self._step(
                    self._params, self._pool, np.zeros(t, np.int32), np.int32(0), np.int32(0), table
                )
            self._pool.block_until_ready()
