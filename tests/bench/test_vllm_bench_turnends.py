"""``agentpark bench vllm``'s turn-end rules (issue 20) without vLLM: the runs and the
daemon settings each gets, the turn ends counted by kind from the daemon's events, the
side-by-side table and the adaptive rule's targets."""

from __future__ import annotations

import math

import pytest

from agentpark import cli
from agentpark.bench.vllm import RunResult, TurnResult, VllmBenchSpec, decisions, failed
from agentpark.bench.vllm.compare import by_kind
from agentpark.bench.vllm.report import print_report
from agentpark.bench.vllm.run import run_order
from agentpark.bench.vllm.spec import DEFAULT_RUNS, RUNS, TURN_ENDS, daemon_env
from agentpark.bench.vllm.variants import variants, verdicts
from agentpark.cli.bench import vllm_spec


def _spec(*argv: str) -> VllmBenchSpec:
    return vllm_spec(cli.parse_args(cli.build_parser(), ["bench", "vllm", *argv]))


def test_each_rule_is_a_run_whose_daemon_is_told_its_rule() -> None:
    spec = VllmBenchSpec(pin_ttl_s=2.5)
    assert daemon_env("park", spec) == {"AGENTPARK_VLLM__TURN_END": "park"}
    assert daemon_env("adaptive", spec) == {"AGENTPARK_VLLM__TURN_END": "adaptive"}
    assert daemon_env("pin", spec) == {
        "AGENTPARK_VLLM__TURN_END": "pin",
        "AGENTPARK_VLLM__PIN_TTL_S": "2.5",
    }
    assert daemon_env("agentpark", spec) == {}  # the daemon's default rule
    assert daemon_env("plain", spec) == {} and "plain" not in TURN_ENDS
    assert set(DEFAULT_RUNS) <= set(RUNS)


def test_the_default_runs_are_the_issues_comparison_each_rule_once_per_client() -> None:
    args = cli.parse_args(cli.build_parser(), ["bench", "vllm"])
    assert tuple(args.runs.split(",")) == DEFAULT_RUNS
    assert run_order(DEFAULT_RUNS, ("agentpark", "none")) == [
        ("reference", "none"),
        ("plain", "none"),
        ("park", "agentpark"),
        ("park", "none"),
        ("pin", "agentpark"),
        ("pin", "none"),
        ("adaptive", "agentpark"),
        ("adaptive", "none"),
    ]


def test_the_pin_ttl_flag_reaches_the_spec_and_is_bounded() -> None:
    assert _spec().pin_ttl_s == 5.0
    assert _spec("--pin-ttl-s", "12").pin_ttl_s == 12.0
    assert VllmBenchSpec(pin_ttl_s=0).problems() == ["--pin-ttl-s must be in (0, 86400], got 0"]
    assert cli.main(["bench", "vllm", "--pin-ttl-s", "-1"]) == 2


def test_turn_ends_are_counted_by_kind_with_pressure_releases_and_pin_ends_apart() -> None:
    events = [
        {"kind": "pin", "reason": "turn_end", "detail": "expected 0.5s: pinned"},
        {"kind": "pin", "reason": "turn_end"},
        {"kind": "pin", "reason": "turn_end"},
        {"kind": "pause", "reason": "turn_end"},
        {"kind": "drop", "reason": "turn_end", "detail": "a human's pause"},
        {"kind": "keep", "detail": "no whole block to park"},
        {"kind": "unpin", "reason": "return", "detail": "return after 0.4s (3 blocks)"},
        {"kind": "unpin", "reason": "timeout", "detail": "timeout after 5s"},
        {"kind": "unpin", "reason": "pressure", "detail": "pressure after 0.1s"},
        {"kind": "pause", "reason": "pressure"},
        {"kind": "drop", "reason": "pressure"},
        {"kind": "unpin", "detail": "restart after 2s"},  # no reason: the detail's cause
        {"kind": "turn"},
        {"kind": "resume"},
    ]
    counts = decisions(events)
    assert counts == {
        "pinned": 3,
        "parked": 1,
        "dropped": 1,
        "kept: no whole block to park": 1,
        "unpin: return": 1,
        "unpin: timeout": 1,
        "unpin: pressure": 1,
        "unpin: restart": 1,
        "parked (pressure)": 1,
        "dropped (pressure)": 1,
    }
    assert by_kind(counts) == {
        "pinned": 3,
        "parked": 1,
        "dropped": 1,
        "kept": 1,
        "released: parked": 1,
        "released: dropped": 1,
        "unpin: return": 1,
        "unpin: timeout": 1,
        "unpin: pressure": 1,
        "unpin: restart": 1,
    }


def _run(name: str, prefill: list[int], ttfts: list[float], client: str = "none") -> RunResult:
    """A run of one agent: turn 0 computes ``prefill[0]``, each later turn (after a tool,
    with ``ttfts[i-1]``) computes ``prefill[i]`` of 2000 prompt tokens."""
    turns = [TurnResult(0, 0, False, 0.5, prefill[0], 0, ["a"], [-1.0])]
    for i, (computed, ttft) in enumerate(zip(prefill[1:], ttfts, strict=True), start=1):
        turns.append(TurnResult(0, i, True, ttft, 2000, 2000 - computed, ["a"], [-1.0]))
    decided = {"pinned": 2, "unpin: return": 2} if name in TURN_ENDS else {}
    return RunResult(name, 10.0, turns, decisions=decided, client=client)


RESULTS = [
    _run("reference", [1000, 100, 100], [0.1, 0.1]),
    _run("plain", [1000, 1200, 1400], [0.8, 1.0]),
    _run("park", [1000, 200, 300], [0.3, 0.9], "agentpark"),
    _run("pin", [1000, 100, 1300], [0.1, 0.9], "agentpark"),
    _run("adaptive", [1000, 100, 150], [0.1, 0.2], "agentpark"),
]


def test_each_run_against_plain_and_the_reference() -> None:
    rows = {row.label: row for row in variants(RESULTS)}
    adaptive = rows["adaptive/agentpark"]
    assert adaptive.prefill == 1250
    assert adaptive.vs_plain == pytest.approx(3600 / 1250)
    assert adaptive.over_reference == pytest.approx(1250 / 1200 - 1)
    assert (adaptive.ttft_p50, adaptive.ttft_p99) == (pytest.approx(0.15), 0.2)
    assert adaptive.ttft_vs_plain == pytest.approx(0.9 / 0.15)
    assert adaptive.turn_ends["pinned"] == 2 and adaptive.turn_ends["unpin: return"] == 2
    assert rows["plain"].turn_ends == {} and rows["reference"].over_reference == 0
    alone = variants([RESULTS[2]])[0]  # no plain, no reference: nothing to divide by
    assert math.isnan(alone.vs_plain) and math.isnan(alone.over_reference)


def test_the_adaptive_targets_are_said_met_or_not() -> None:
    lines = verdicts(RESULTS)
    assert lines[0].startswith("adaptive/agentpark: +4.2% prefill vs the reference")
    assert "(target <= +5%: met)" in lines[0]
    assert "2.88x fewer than plain (target >= 2x: met)" in lines[0]
    assert "6.00x lower than plain (target >= 2x: met)" in lines[0]
    assert "vs park/agentpark: prefill 1,250 vs 1,500" in lines[1] and lines[1].endswith("met)")
    assert "vs pin/agentpark: prefill 1,250 vs 2,400" in lines[2]
    worse = [*RESULTS[:4], _run("adaptive", [1000, 300, 300], [0.3, 1.0], "agentpark")]
    lines = verdicts(worse)
    assert "(target <= +5%: NOT met)" in lines[0]
    assert all(line.endswith("NOT met)") for line in lines[1:])
    assert verdicts(RESULTS[:4]) == []  # no adaptive run, no targets


def test_the_report_prints_the_rules_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    print_report(list(RESULTS), VllmBenchSpec(agents=1, turns=3), 48)
    out = capsys.readouterr().out
    assert "turn-end rules at 48 blocks" in out
    for label in ("park/agentpark", "pin/agentpark", "adaptive/agentpark"):
        assert f"{label} vs plain:" in out  # every rule's run against plain
    assert "+4.2%" in out and "+100.0%" in out  # adaptive and pin against the reference
    assert "return 2" in out  # pins ended by cause
    assert "adaptive/agentpark vs pin/agentpark" in out
    assert not failed(RESULTS, VllmBenchSpec())


def test_one_agentpark_run_prints_no_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    print_report(
        [*RESULTS[:2], _run("agentpark", [1000, 100, 100], [0.1, 0.1], "agentpark")],
        VllmBenchSpec(agents=1, turns=3),
        48,
    )
    out = capsys.readouterr().out
    assert "agentpark/agentpark vs plain" in out and "turn-end rules" not in out


def test_a_copy_behind_a_pin_is_counted_apart_from_the_turn_ends_parked() -> None:
    events = [
        {"kind": "pin", "reason": "turn_end"},
        {"kind": "pause", "reason": "pin_copy"},  # the pin's copy: not a park of its own
        {"kind": "pause", "reason": "turn_end"},
    ]
    counts = decisions(events)
    assert counts == {"pinned": 1, "copies behind pins": 1, "parked": 1}
    assert by_kind(counts) == {
        "pinned": 1,
        "parked": 1,
        "dropped": 0,
        "kept": 0,
        "copies behind pins": 1,
    }
