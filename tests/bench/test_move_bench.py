"""``agentpark bench move`` end to end with a tiny model and two sessions."""

from __future__ import annotations

import pytest

from agentpark.bench.move import BENCH_MODEL, KV_LAYOUTS, _geometry, run_move_bench, socket_copy_s
from agentpark.cli import main

TINY_MODEL = {
    "d_model": 64,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "head_dim": 16,
    "ffn_dim": 128,
}


def test_the_move_bench_drains_every_session_and_prints_the_ratio_and_load(
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs = run_move_bench(sessions=2, tokens=64, repeats=1, model=TINY_MODEL)
    out = capsys.readouterr().out
    assert len(runs) == 1
    run = runs[0]
    # 64 tokens in blocks of 16: 4 blocks a session of 2 layers x K,V x 16 x 2 x 16 bfloat16.
    assert run.sessions == 2 and run.nbytes == 2 * 4 * (2 * 2 * 16 * 2 * 16 * 2)
    assert run.drain_s > 0 and run.socket_s > 0 and run.ratio > 0
    assert "move MB/s" in out and "socket MB/s" in out and "median ratio" in out
    assert "(4 KiB a block)" in out
    assert "load average" in out


def test_the_socket_reference_moves_every_byte() -> None:
    assert socket_copy_s(3 * 2**20 + 5, 2**20) > 0


def test_the_default_layout_carries_a_real_8b_models_kv() -> None:
    # Llama-3-8B / Mistral-7B: 32 layers x K,V x 8 KV heads x 128 x bfloat16 = 128 KiB a
    # token, 2 MiB a 16-token block; "small" is 16x less.
    assert BENCH_MODEL is KV_LAYOUTS["llama3-8b"]
    blocks, block = _geometry(BENCH_MODEL, 1024)
    assert (blocks, block) == (1024 // 16 + 1, 2 * 2**20)
    assert _geometry(KV_LAYOUTS["small"], 1024)[1] * 16 == block


def test_the_command_refuses_an_unknown_kv_layout(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "move", "--kv", "llama3-70b"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
