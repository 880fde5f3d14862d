"""The daemon's block keys are vLLM's: hashed here and through vLLM 0.32's own functions.

A real ``vllm.v1.request.Request`` (with its cache salt and LoRA) is hashed by the block
hasher vLLM's scheduler uses (``get_request_block_hasher``), for both hash algorithms a
router can recompute; agentpark.kvkeys must give the same chain, block for block.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from agentpark.kvkeys import DEFAULT_SEED, BlockHasher, Lora

with warnings.catch_warnings():  # vLLM's imports warn of torch APIs it still uses
    warnings.simplefilter("ignore", DeprecationWarning)
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.utils.hashing import sha256, sha256_cbor
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.request import Request

BLOCK = 16
TOKENS = [(i * 7919) % 32_000 for i in range(5 * BLOCK + 3)]  # 5 whole blocks and a part


def _vllm_chain(
    algo: str, salt: str | None, lora: Any, monkeypatch: pytest.MonkeyPatch
) -> list[bytes]:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    fn = {"sha256": sha256, "sha256_cbor": sha256_cbor}[algo]
    kv_cache_utils.init_none_hash(fn)
    hasher = kv_cache_utils.get_request_block_hasher(BLOCK, fn)
    request = Request(
        "r",
        list(TOKENS),
        SamplingParams(max_tokens=1),
        None,
        lora_request=lora,
        cache_salt=salt,
        block_hasher=hasher,
    )
    return [bytes(h) for h in request.block_hashes]


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
@pytest.mark.parametrize("salt", [None, "tenant-a"])
@pytest.mark.parametrize("with_lora", [False, True])
def test_the_chain_is_vllms_own(
    algo: str, salt: str | None, with_lora: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    lora = LoRARequest("adapter", 1, "/adapters/a") if with_lora else None
    theirs = _vllm_chain(algo, salt, lora, monkeypatch)
    ours = BlockHasher(BLOCK, algo, DEFAULT_SEED).chain(  # type: ignore[arg-type]
        TOKENS, cache_salt=salt, lora=Lora("adapter", "/adapters/a") if with_lora else None
    )
    assert len(theirs) == 5 and ours == theirs


def test_a_salt_or_an_adapter_changes_every_key_a_token_change_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = _vllm_chain("sha256", None, None, monkeypatch)
    salted = _vllm_chain("sha256", "s", None, monkeypatch)
    assert not set(plain) & set(salted)  # the salt is in block 0, so in every key after it
    hasher = BlockHasher(BLOCK)
    changed = list(TOKENS)
    changed[3 * BLOCK] += 1
    keys = hasher.chain(changed)
    assert keys[:3] == plain[:3] and not set(keys[3:]) & set(plain)
    # A continued chain re-hashes only the new blocks and agrees with the whole one.
    assert hasher.chain(TOKENS[3 * BLOCK :], parent=plain[2], first_block=3) == plain[3:]
