"""``agentpark bench vllm --repeats N --save F``: the repeats side by side (median and
range per run), the targets counted over the repeats, the turns saved as JSON, and the
pinned share a sweep gives the daemon; without vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentpark import cli
from agentpark.bench.vllm import RunResult, TurnResult, VllmBenchSpec
from agentpark.bench.vllm.repeats import save, target_counts
from agentpark.bench.vllm.report import print_noise
from agentpark.bench.vllm.spec import daemon_env
from agentpark.cli.bench import vllm_spec


def _run(name: str, computed: int, ttft: float, client: str = "none") -> RunResult:
    """One agent, two turns: the second after a tool, computing ``computed`` of 2000."""
    turns = [
        TurnResult(0, 0, False, 0.5, 1000, 0, ["a"], [-1.0]),
        TurnResult(0, 1, True, ttft, 2000, 2000 - computed, ["b"], [-2.0]),
    ]
    return RunResult(name, 10.0, turns, client=client)


def _repeat(adaptive_computed: int, adaptive_ttft: float) -> list[RunResult]:
    return [
        _run("reference", 100, 0.1),
        _run("plain", 2000, 1.0),
        _run("park", 300, 0.4, "agentpark"),
        _run("pin", 300, 0.4, "agentpark"),
        _run("adaptive", adaptive_computed, adaptive_ttft, "agentpark"),
    ]


REPEATS = [_repeat(100, 0.1), _repeat(150, 0.2), _repeat(900, 0.9)]


def test_targets_are_counted_over_the_repeats() -> None:
    lines = target_counts(REPEATS)
    # Within 5% of the reference's 1100, 2x fewer than plain's 3000 and 2x faster: 1100
    # and 1150 (+4.5%), not 1900; fewer than park's and pin's 1300 with a lower p99: the
    # same two.
    assert "adaptive/agentpark: plain and reference: met in 2 of 3 repeats" in lines
    assert "adaptive/agentpark: beats park/agentpark: met in 2 of 3 repeats" in lines
    assert "adaptive/agentpark: beats pin/agentpark: met in 2 of 3 repeats" in lines


def test_the_noise_table_gives_each_runs_median_and_range(
    capsys: pytest.CaptureFixture[str],
) -> None:
    print_noise(REPEATS)
    out = capsys.readouterr().out
    assert "over 3 repeats" in out
    assert "1,150 [1,100-1,900]" in out  # adaptive's prefill
    assert "0.200 [0.100-0.900]" in out  # adaptive's TTFT after a tool
    assert "load average at the end" in out


def test_every_repeats_turns_are_saved_as_json(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    save(path, VllmBenchSpec(repeats=3), 48, REPEATS)
    body = json.loads(path.read_text())
    assert body["blocks"] == 48 and body["spec"]["repeats"] == 3
    assert len(body["repeats"]) == 3
    adaptive = body["repeats"][2][4]
    assert adaptive["name"] == "adaptive" and adaptive["turns"][1]["cached_tokens"] == 1100


def test_repeats_and_the_pinned_share_are_flags_and_bounded() -> None:
    def spec(*argv: str) -> VllmBenchSpec:
        return vllm_spec(cli.parse_args(cli.build_parser(), ["bench", "vllm", *argv]))

    assert spec().repeats == 1 and spec().pin_share is None
    swept = spec("--repeats", "3", "--pin-share", "0.25")
    assert swept.repeats == 3 and swept.pin_share == 0.25
    assert daemon_env("adaptive", swept)["AGENTPARK_VLLM__PIN_SHARE"] == "0.25"
    assert daemon_env("agentpark", swept) == {"AGENTPARK_VLLM__PIN_SHARE": "0.25"}
    assert "AGENTPARK_VLLM__PIN_SHARE" not in daemon_env("park", swept)  # park never pins
    assert VllmBenchSpec(repeats=0).problems() == ["--repeats must be in [1, 20], got 0"]
    assert VllmBenchSpec(pin_share=1.5).problems() == ["--pin-share must be in [0, 1], got 1.5"]
    assert cli.main(["bench", "vllm", "--repeats", "0"]) == 2
