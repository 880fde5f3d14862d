"""``agentpark bench vllm``'s bookkeeping without vLLM: prefill computed, the turns compared
with the reference, the quantiles, the table, and the refusal of unknown runs."""

from __future__ import annotations

import pytest

from agentpark import cli
from agentpark.bench.vllm import (
    RunResult,
    TurnResult,
    VllmBenchSpec,
    _differs,
    _logprob_breakdown,
    _print,
    _quantile,
)


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
    assert _differs(same, reference) == (0, 0)
    assert _differs(rounded, reference) == (1, 1)


def test_logprob_differences_are_split_into_first_restored_and_other_turns() -> None:
    restored = {"agentpark": {"decision": "parked", "restored_tokens": 256}}
    reference = RunResult(
        "reference",
        1.0,
        [_turn(a, t, ["x"], [-1.0]) for a in range(2) for t in range(3)],
    )
    parked = RunResult(
        "agentpark",
        1.0,
        [
            _turn(0, 0, ["x"], [-1.5]),  # a first turn differs: the servers' scheduling
            _turn(1, 0, ["x"], [-1.0]),
            _turn(0, 1, ["x"], [-1.0], transfer=restored),
            _turn(1, 1, ["x"], [-0.9], transfer=restored),
            _turn(0, 2, ["x"], [-0.9], transfer={"agentpark": {"restored_tokens": 0}}),
            _turn(1, 2, ["x"], [-1.0], error="boom"),  # not compared
        ],
    )
    assert _logprob_breakdown(parked, reference) == {
        "first turns": (1, 2),
        "restored turns": (1, 2),
        "other turns": (1, 1),
    }


def test_quantile_of_nothing_is_nan() -> None:
    assert _quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert _quantile([1.0, 2.0], 0.99) == 2.0
    assert _quantile([], 0.5) != _quantile([], 0.5)  # nan


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
    )
    _print([reference, plain, parked], spec, 48)
    out = capsys.readouterr().out
    for text in ("reference", "plain", "agentpark", "3 / 2 MiB", "2,100", "1,100"):
        assert text in out, text
    # prefill 2100 / 1100 and TTFT 0.8 / 0.2 after the tool.
    assert "1.91x fewer prefill tokens" in out
    assert "4.00x lower p50 TTFT" in out
    assert "agentpark: turns whose logprobs differ from the reference: first turns 0 of 1" in out


def test_unknown_runs_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "vllm", "--runs", "plain,fast"]) == 2
    assert "unknown runs ['fast']" in capsys.readouterr().err
