"""``agentpark bench vllm``'s bookkeeping without vLLM: prefill computed, the turns compared
with the reference, the quantiles, the table, and the refusal of unknown runs."""

from __future__ import annotations

import pytest

from agentpark import cli
from agentpark.bench.vllm import (
    RunResult,
    TurnResult,
    VllmBenchSpec,
    breakdown,
    decisions,
    failed,
    mark_restored,
)
from agentpark.bench.vllm.compare import differs
from agentpark.bench.vllm.report import print_report, quantile


def _turn(
    agent: int, turn: int, tokens: list[str], logprobs: list[float], **kw: object
) -> TurnResult:
    fields: dict[str, object] = {
        "after_tool": turn > 0,
        "ttft_s": 0.1 * (turn + 1),
        "prompt_tokens": 1000 + 100 * turn,
        "cached_tokens": 0 if turn == 0 else 1000,
    }
    fields.update(kw)
    return TurnResult(agent, turn, tokens=tokens, logprobs=logprobs, **fields)  # type: ignore[arg-type]


def test_prefill_computed_and_ttfts_count_only_what_was_computed() -> None:
    run = RunResult(
        "plain",
        10.0,
        [_turn(0, 0, ["a"], [-1.0]), _turn(0, 1, ["b"], [-1.0]), _turn(1, 1, [], [], error="x")],
    )
    # 1000 + (1100 - 1000) + an error row that computed nothing.
    assert run.prefill_computed == 1000 + 100 + (1100 - 1000)
    assert run.ttfts() == [pytest.approx(0.2)]  # after a tool, and not the failed turn
    assert [t.error for t in run.errors()] == ["x"]


def test_differs_counts_tokens_and_logprobs_separately() -> None:
    reference = RunResult(
        "reference", 1.0, [_turn(0, 0, ["a", "b"], [-1.0, -2.0]), _turn(0, 1, ["c"], [-0.5])]
    )
    same = RunResult(
        "agentpark", 1.0, [_turn(0, 0, ["a", "b"], [-1.0, -2.0]), _turn(0, 1, ["c"], [-0.5])]
    )
    rounded = RunResult(
        "plain", 1.0, [_turn(0, 0, ["a", "b"], [-1.0, -2.0000001]), _turn(0, 1, ["d"], [-0.5])]
    )
    assert differs(same, reference) == (0, 0)
    assert differs(rounded, reference) == (1, 1)


def test_restored_turns_come_from_the_daemons_resume_events() -> None:
    turns = [_turn(a, t, ["x"], [-1.0]) for a in range(2) for t in range(3)]
    events = [  # newest first, as /v1/events answers; other sessions' events ignored
        {"id": 9, "session_id": "s0", "kind": "turn"},
        {"id": 8, "session_id": "s0", "kind": "resume", "bytes": 4096},
        {"id": 7, "session_id": "s1", "kind": "resume", "bytes": 2048},
        {"id": 6, "session_id": "other", "kind": "turn"},
        {"id": 5, "session_id": "s1", "kind": "pause", "bytes": 2048},
        {"id": 4, "session_id": "s1", "kind": "turn"},
        {"id": 3, "session_id": "s0", "kind": "turn"},
        {"id": 2, "session_id": "s0", "kind": "turn"},
        {"id": 1, "session_id": "s0", "kind": "create"},
    ]
    mark_restored(turns, events, ["s0", "s1"])
    restored = {(t.agent, t.turn): t.restored_bytes for t in turns if t.restored_bytes}
    assert restored == {(0, 2): 4096, (1, 1): 2048}


def test_turn_end_decisions_are_counted_by_reason() -> None:
    events = [
        {"kind": "pause"},
        {"kind": "pause"},
        {
            "kind": "keep",
            "detail": "expected pause 0.5s (given by the caller) is shorter than "
            "the break-even 1s (round trip 3 ms, min_pause_s 1s)",
        },
        {"kind": "keep", "detail": "no whole block to park"},
        {"kind": "turn"},
    ]
    assert decisions(events) == {
        "parked": 2,
        "kept: short pause": 1,
        "kept: no whole block to park": 1,
    }


def test_differences_are_split_by_kind_of_turn() -> None:
    reference = RunResult(
        "reference", 1.0, [_turn(a, t, ["x"], [-1.0]) for a in range(3) for t in range(3)]
    )
    parked = RunResult(
        "agentpark",
        1.0,
        [
            _turn(0, 0, ["x"], [-1.5]),  # a first turn differs: the servers' batching
            _turn(1, 0, ["x"], [-1.0]),
            _turn(2, 0, ["x"], [-1.0]),
            _turn(0, 1, ["x"], [-1.0], restored_bytes=4096),
            _turn(1, 1, ["y"], [-0.9], restored_bytes=4096),
            # agent 2 recomputed its evicted prefix in turn 1, then had it restored
            _turn(2, 1, ["x"], [-0.9], cached_tokens=0),
            _turn(2, 2, ["x"], [-0.8], restored_bytes=4096),
            _turn(0, 2, ["y"], [-0.9]),  # computed by vLLM again
            _turn(1, 2, ["x"], [-1.0], error="boom"),  # not compared
        ],
    )
    assert breakdown(parked, reference) == {
        "first turns": (0, 1, 3),
        "restored turns": (1, 1, 2),
        "restored after a recompute": (0, 1, 1),
        "other turns": (1, 2, 2),
    }


def test_only_the_exact_mode_fails_on_a_restored_turn_thatdiffers() -> None:
    reference = RunResult(
        "reference", 1.0, [_turn(0, 0, ["x"], [-1.0]), _turn(0, 1, ["x"], [-1.0])]
    )
    rounded = RunResult(
        "agentpark",
        1.0,
        [_turn(0, 0, ["x"], [-1.0]), _turn(0, 1, ["x"], [-1.25], restored_bytes=64)],
    )
    recomputed = RunResult(
        "agentpark", 1.0, [_turn(0, 0, ["x"], [-1.0]), _turn(0, 1, ["y"], [-1.25])]
    )
    broken = RunResult("plain", 1.0, [_turn(0, 0, [], [], error="refused")])
    batched, exact = VllmBenchSpec(), VllmBenchSpec(max_num_seqs=1)
    assert not failed([reference, rounded], batched)
    assert failed([reference, rounded], exact)
    assert not failed([reference, recomputed], exact)  # vLLM computed it: may round
    after_recompute = RunResult(
        "agentpark",
        1.0,
        [
            _turn(0, 0, ["x"], [-1.0], cached_tokens=500),
            _turn(0, 1, ["x"], [-1.25], restored_bytes=64),
        ],
    )
    assert not failed([reference, after_recompute], exact)
    assert failed([reference, broken], batched)


def test_quantile_of_nothing_is_nan() -> None:
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([1.0, 2.0], 0.99) == 2.0
    assert quantile([], 0.5) != quantile([], 0.5)  # nan


def test_table_shows_every_run_and_the_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    spec = VllmBenchSpec(agents=1, turns=2)
    tokens = (["a"], [-1.0])
    reference = RunResult("reference", 5.0, [_turn(0, 0, *tokens), _turn(0, 1, *tokens)])
    plain = RunResult(
        "plain", 9.0, [_turn(0, 0, *tokens), _turn(0, 1, *tokens, cached_tokens=0, ttft_s=0.8)]
    )
    parked = RunResult(
        "agentpark",
        6.0,
        [_turn(0, 0, *tokens), _turn(0, 1, *tokens, ttft_s=0.2)],
        host={"counters": {"bytes_parked": 3 << 20, "bytes_restored": 2 << 20}},
        client="agentpark",
    )
    print_report([reference, plain, parked], spec, 48)
    out = capsys.readouterr().out
    for text in ("reference", "plain", "agentpark", "3 / 2 MiB", "2,100", "1,100"):
        assert text in out, text
    # prefill 2100 / 1100 and TTFT 0.8 / 0.2 after the tool.
    assert "agentpark/agentpark vs plain: 1.91x fewer prefill tokens (target >= 2)" in out
    assert "4.00x lower p50 TTFT after a tool" in out
    assert "1.91x" in out.split("agentpark/agentpark")[1]  # the table's column too
    differing = "agentpark/agentpark, turns differing from the reference: first turns 1: "
    assert differing + "tokens 0, logprobs 0" in out


def test_unknown_runs_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "vllm", "--runs", "plain,fast"]) == 2
    assert "unknown runs ['fast']" in capsys.readouterr().err
