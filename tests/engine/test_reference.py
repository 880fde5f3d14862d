"""ReferenceEngine: bit-exact results whatever block ids hold a session's KV.

Every engine here uses the default specs, so the jitted steps compile once per process.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentpark.engine import (
    EngineAdapter,
    ModelSpec,
    PoolSpec,
    ReferenceEngine,
)
from agentpark.engine.reference import _rope

BS = PoolSpec().block_size


def _tokens(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 256, n)]


def _bits(x: np.ndarray) -> bytes:
    assert x.dtype == np.float32
    return x.tobytes()


def _pool_np(engine: ReferenceEngine) -> np.ndarray:
    with engine.lock:
        return np.array(engine.kv_pool()[0])  # a copy, not a view of the live pool


def _fill_random(engine: ReferenceEngine, seed: int) -> np.ndarray:
    """Fill the pool with random bits (NaN and inf bf16 patterns included)."""
    geo = engine.geometry
    shape = (geo.num_blocks, *geo.arrays[0].block_shape)
    junk = np.random.default_rng(seed).integers(0, 2**16, shape, dtype=np.uint16)
    engine.set_kv_pool([jnp.array(junk)])
    return junk


@functools.partial(jax.jit, donate_argnums=0)
def _scatter_blocks(pool: jax.Array, ids: jax.Array, rows: jax.Array) -> jax.Array:
    return pool.at[ids].set(rows)


def _copy_blocks(engine: ReferenceEngine, src: list[int], dst: list[int]) -> None:
    """What a pause + restore does: rows out through numpy, back in with a donated scatter."""
    with engine.lock:
        rows = np.asarray(engine.kv_pool()[0])[src]  # fancy indexing copies the rows
        new = _scatter_blocks(engine.kv_pool()[0], jnp.asarray(dst, jnp.int32), rows)
        engine.set_kv_pool([new])


def test_engine_shape_and_identity() -> None:
    engine = ReferenceEngine(ModelSpec(), PoolSpec())
    assert isinstance(engine, EngineAdapter)
    geo = engine.geometry
    assert geo.arrays[0].block_shape == (2, 2, 16, 2, 16)
    assert geo.arrays[0].dtype == "uint16"
    assert geo.block_nbytes == 2 * 2 * 16 * 2 * 16 * 2
    assert geo.total_bytes == 256 * geo.block_nbytes
    (pool,) = engine.kv_pool()
    assert pool.shape == (256, 2, 2, 16, 2, 16) and pool.dtype == jnp.uint16
    assert (engine.vocab_size, engine.max_seq_len) == (256, 1024)
    assert engine.allocator.total == 256
    assert (engine.blocks_for(0), engine.blocks_for(16), engine.blocks_for(17)) == (0, 1, 2)

    uid = engine.model_uid
    assert len(uid) == 16 and int(uid, 16) >= 0
    assert ReferenceEngine().model_uid == uid
    assert ReferenceEngine(ModelSpec(seed=1)).model_uid != uid
    assert ReferenceEngine(pool=PoolSpec(num_blocks=128)).model_uid != uid


def test_tokenizer_round_trip() -> None:
    engine = ReferenceEngine()
    text = "héllo, wörld ✓"
    tokens = engine.tokenize(text)
    assert tokens == list(text.encode()) and max(tokens) < engine.vocab_size
    assert engine.detokenize(tokens) == text
    assert engine.detokenize(tokens[:-1]) == "héllo, wörld \ufffd"  # cut multi-byte char


def test_same_seed_is_bit_identical_and_seed_matters() -> None:
    tokens = _tokens(40)
    a = ReferenceEngine().extend([0, 1, 2], 0, tokens)
    b = ReferenceEngine().extend([0, 1, 2], 0, tokens)
    assert a.shape == (256,) and a.dtype == np.float32
    assert np.all(np.isfinite(a))
    assert _bits(a) == _bits(b)
    c = ReferenceEngine(ModelSpec(seed=1)).extend([0, 1, 2], 0, tokens)
    assert not np.array_equal(a, c)


def test_block_ids_do_not_change_results_and_copied_blocks_decode_identically() -> None:
    engine = ReferenceEngine()
    prompt, cont = _tokens(40, seed=1), _tokens(10, seed=2)  # decode crosses into a 4th block
    table_a, table_b, table_c = [0, 1, 2, 30], [7, 3, 9, 31], [20, 5, 11, 32]

    logits_a = engine.extend(table_a, 0, prompt)
    logits_b = engine.extend(table_b, 0, prompt)
    assert _bits(logits_a) == _bits(logits_b)
    pool = _pool_np(engine)
    assert pool[table_a[:3]].tobytes() == pool[table_b[:3]].tobytes()

    # "Park" A: copy its rows out and back into different block ids.
    _copy_blocks(engine, table_a[:3], table_c[:3])
    assert _pool_np(engine)[table_c[:3]].tobytes() == pool[table_a[:3]].tobytes()

    for i, tok in enumerate(cont):
        pos = len(prompt) + i
        la = engine.extend(table_a, pos, [tok])
        lc = engine.extend(table_c, pos, [tok])
        assert _bits(la) == _bits(lc), f"diverged at position {pos}"
    # ...and a different path to the same context (chunks of another size) is only close.
    lb = engine.extend(table_b, len(prompt), cont)
    np.testing.assert_allclose(lb, la, atol=1e-3)


def test_garbage_in_unused_slots_does_not_leak() -> None:
    """Other blocks' bytes (even NaN bit patterns) never reach a session's results."""
    tokens = _tokens(21, seed=3)
    clean = ReferenceEngine()
    dirty = ReferenceEngine()
    _fill_random(dirty, seed=4)
    assert _bits(clean.extend([4, 5], 0, tokens)) == _bits(dirty.extend([4, 5], 0, tokens))
    assert _bits(clean.extend([4, 5], 21, [9])) == _bits(dirty.extend([4, 5], 21, [9]))


def test_chunk_and_token_by_token_agree() -> None:
    tokens = _tokens(40, seed=5)
    engine = ReferenceEngine()
    chunked = engine.extend([0, 1, 2], 0, tokens)
    for pos, tok in enumerate(tokens):
        stepped = engine.extend([3, 4, 5], pos, [tok])
    np.testing.assert_allclose(stepped, chunked, atol=1e-3, rtol=0)
    # A wrong mask or position would show here: the logits depend on the whole prefix.
    other = engine.extend([6, 7, 8], 0, [*tokens[:-2], tokens[-1], tokens[-2]])
    assert np.abs(other - chunked).max() > 1e-2


def test_position_matters() -> None:
    """Swapping two earlier tokens changes a 1-layer model's output only through RoPE.

    (Without positions, one attention layer is invariant to the order of the keys.)
    """
    engine = ReferenceEngine(ModelSpec(n_layers=1))
    xyz = engine.extend([0], 0, [10, 200, 65])
    yxz = engine.extend([1], 0, [200, 10, 65])
    assert np.abs(xyz - yxz).max() > 1e-3


def test_rope_scores_depend_on_relative_position_only() -> None:
    rng = np.random.default_rng(11)
    q = jnp.asarray(rng.normal(size=(1, 1, 16)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(1, 1, 16)), jnp.float32)

    def score(pq: int, pk: int) -> float:
        rq = _rope(q, jnp.asarray([pq], jnp.int32))
        rk = _rope(k, jnp.asarray([pk], jnp.int32))
        return float(jnp.sum(rq * rk))

    assert score(7, 3) == pytest.approx(score(104, 100), abs=1e-4)
    assert abs(score(7, 3) - score(7, 4)) > 1e-3


def test_long_input_is_split_into_chunks() -> None:
    tokens = _tokens(300, seed=6)
    engine = ReferenceEngine()
    nblocks = engine.blocks_for(300)
    one_call = engine.extend(list(range(nblocks)), 0, tokens)
    table = list(range(100, 100 + nblocks))
    for start in range(0, 300, 100):
        pieces = engine.extend(table, start, tokens[start : start + 100])
    np.testing.assert_allclose(pieces, one_call, atol=1e-3, rtol=0)
    # identical splitting for the same (start_pos, length): bit-identical in other blocks
    again = engine.extend(list(range(200, 200 + nblocks)), 0, tokens)
    assert _bits(again) == _bits(one_call)


def test_padding_does_not_write_outside_the_session() -> None:
    engine = ReferenceEngine()
    before = _fill_random(engine, seed=7)
    engine.extend([3], 0, _tokens(5, seed=8))  # 5 tokens padded to a 16-token bucket
    after = _pool_np(engine)
    others = np.ones(before.shape[0], bool)
    others[3] = False
    assert after[others].tobytes() == before[others].tobytes()
    # inside block 3 only offsets 0..4 changed (axis 2 of a block row is the token offset)
    assert after[3, :, :, 5:].tobytes() == before[3, :, :, 5:].tobytes()
    assert after[3, :, :, :5].tobytes() != before[3, :, :, :5].tobytes()


def test_warmup_leaves_the_pool_alone() -> None:
    engine = ReferenceEngine()
    before = _fill_random(engine, seed=9)
    engine.warmup()
    assert _pool_np(engine).tobytes() == before.tobytes()


def test_extend_writes_in_place() -> None:
    engine = ReferenceEngine()
    engine.extend([0], 0, [1, 2, 3])  # first call may compile
    ptr = engine.kv_pool()[0].unsafe_buffer_pointer()
    engine.extend([0], 3, [4])
    assert engine.kv_pool()[0].unsafe_buffer_pointer() == ptr


@pytest.mark.parametrize(
    ("table", "start", "tokens", "match"),
    [
        (list(range(64)), 1020, [1] * 5, "max_seq_len"),
        (list(range(64)), 0, [1] * 1025, "max_seq_len"),
        ([0], 0, [1] * 17, "need 2 blocks"),
        ([0, 1], 16, [1] * 17, "need 3 blocks"),
        ([0], 0, [], "at least one token"),
        ([0], -1, [1], "start_pos"),
        ([256], 0, [1], "block ids"),
        ([0, 0], 0, [1] * 20, "repeats"),
        ([0], 0, [256], "token ids"),
    ],
)
def test_extend_rejects_bad_requests(
    table: list[int], start: int, tokens: list[int], match: str
) -> None:
    engine = ReferenceEngine()
    before = _pool_np(engine)
    with pytest.raises(ValueError, match=match):
        engine.extend(table, start, tokens)
    assert _pool_np(engine).tobytes() == before.tobytes()


def test_set_kv_pool_checks_shape_and_dtype() -> None:
    engine = ReferenceEngine()
    (pool,) = engine.kv_pool()
    with pytest.raises(ValueError):
        engine.set_kv_pool([pool.astype(jnp.float32)])
    with pytest.raises(ValueError):
        engine.set_kv_pool([pool[:10]])
    with pytest.raises(ValueError):
        engine.set_kv_pool([pool, pool])
