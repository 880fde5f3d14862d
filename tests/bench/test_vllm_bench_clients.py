"""``agentpark bench vllm --client ... --workload ...`` without vLLM: the flags and the spec
they make, what each client sends, the runs' order, the ratios to plain and the pool's
figures (bytes parked against one copy per session) the report prints."""

from __future__ import annotations

import math

import pytest

from agentpark import cli
from agentpark.bench.vllm import RunResult, TurnResult, VllmBenchSpec, failed
from agentpark.bench.vllm.drive import naming
from agentpark.bench.vllm.parked import GIB, pool_figures
from agentpark.bench.vllm.report import print_report, ratios
from agentpark.bench.vllm.run import run_order
from agentpark.bench.vllm.workload import AgentPlan, Step
from agentpark.cli.bench import vllm_spec


def _spec(*argv: str) -> VllmBenchSpec:
    return vllm_spec(cli.parse_args(cli.build_parser(), ["bench", "vllm", *argv]))


def test_the_flags_make_the_spec() -> None:
    assert _spec() == VllmBenchSpec()
    spec = _spec(
        "--client",
        "agentpark, session-id,none",
        "--workload",
        "multi-turn",
        "--agents",
        "12",
        "--turns",
        "8",
        "--common-prefix-tokens",
        "500",
        "--conversation-prefix-tokens",
        "900",
        "--user-tokens",
        "120,160",
        "--answer-tokens",
        "80,120",
        "--concurrency",
        "3",
        "--max-model-len",
        "8192",
        "--blocks",
        "80",
    )
    assert spec.clients == ("agentpark", "session-id", "none")
    assert (spec.workload, spec.agents, spec.turns, spec.concurrency) == ("multi-turn", 12, 8, 3)
    assert (spec.common_prefix_tokens, spec.conversation_prefix_tokens) == (500, 900)
    assert (spec.user_tokens, spec.answer_tokens) == ((120, 160), (80, 120))
    assert (spec.max_model_len, spec.small_blocks()) == (8192, 80)
    shared = _spec("--workload", "shared-prefix", "--agents", "16", "--system-tokens", "2048")
    assert (shared.workload, shared.agents, shared.system_tokens) == ("shared-prefix", 16, 2048)
    assert shared.problems() == []


def test_the_small_kv_cache_by_workload() -> None:
    assert VllmBenchSpec().small_blocks() == 48  # 1.5 agents of 4096 tokens
    # The fewest vLLM starts with: a request of --max-model-len and the block it keeps aside.
    assert VllmBenchSpec(workload="multi-turn").small_blocks() == 33
    assert VllmBenchSpec(workload="shared-prefix").small_blocks() == 33
    assert VllmBenchSpec(workload="multi-turn", max_model_len=2048).small_blocks() == 17
    assert VllmBenchSpec(max_model_len=8192).small_blocks() == 96


def test_flags_it_cannot_run_are_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["bench", "vllm", "--client", "agentpark,x-session"]) == 2
    assert "unknown clients ['x-session']" in capsys.readouterr().err
    assert cli.main(["bench", "vllm", "--client", "none,none"]) == 2
    assert "a client named twice" in capsys.readouterr().err
    argv = ["bench", "vllm", "--workload", "shared-prefix", "--system-tokens", "100"]
    assert cli.main(argv) == 2
    assert "--system-tokens must be at least one block (128)" in capsys.readouterr().err
    assert cli.main(["bench", "vllm", "--blocks", "32"]) == 2  # vLLM refuses 4096 then
    assert "--blocks 32 is too small for --max-model-len 4096" in capsys.readouterr().err
    assert cli.main(["bench", "vllm", "--user-tokens", "160,120"]) == 2
    assert "--user-tokens must be MIN,MAX" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="cannot read --answer-tokens '80'"):
        cli.main(["bench", "vllm", "--answer-tokens", "80"])
    with pytest.raises(SystemExit):
        cli.main(["bench", "vllm", "--workload", "chat"])
    assert "invalid choice: 'chat'" in capsys.readouterr().err


def test_plain_vllm_runs_once_and_agentpark_once_per_client() -> None:
    clients = ("agentpark", "session-id", "none")
    assert run_order(("agentpark", "plain", "reference"), clients) == [
        ("reference", "none"),
        ("plain", "none"),
        ("agentpark", "agentpark"),
        ("agentpark", "session-id"),
        ("agentpark", "none"),
    ]
    assert run_order(("plain",), clients) == [("plain", "none")]


def _plan(tool: str | None) -> AgentPlan:
    step = Step(tool, 3.0 if tool else 0.0, 1.0, "call_0_0", "{}", "result", "answer")
    return AgentPlan("bench-agent-0", [{"role": "user", "content": "hi"}], [step])


def test_each_client_names_its_session_its_own_way() -> None:
    agents = _plan("run_tests")
    assert naming("agentpark", agents, 0) == {
        "extra_body": {
            "ignore_eos": True,
            "kv_transfer_params": {
                "agentpark": {
                    "session_id": "bench-agent-0",
                    "tool": "run_tests",
                    "expected_resume_s": 3.0,
                }
            },
        }
    }
    last = {"agentpark": {"session_id": "bench-agent-0"}}  # no tool follows the last turn
    assert naming("agentpark", agents, 1)["extra_body"]["kv_transfer_params"] == last
    conversation = _plan(None)  # a conversation has no tool to tell
    assert naming("agentpark", conversation, 0)["extra_body"]["kv_transfer_params"] == last
    assert naming("session-id", agents, 0) == {
        "extra_body": {"ignore_eos": True},
        "extra_headers": {"X-Session-ID": "bench-agent-0"},
    }
    assert naming("none", agents, 0) == {"extra_body": {"ignore_eos": True}}


def _turns(computed: list[int], ttft: float) -> list[TurnResult]:
    return [
        TurnResult(0, turn, turn > 0, ttft, 1000 + n, 1000, ["x"], [-1.0])
        for turn, n in enumerate(computed)
    ]


def _host(parked: int, reclaimed: int, used: int, copied: int) -> dict[str, object]:
    return {
        "sessions": {"parked": parked, "active": 0},
        "reclaimed_bytes": reclaimed,
        "tiers": {"dram": {"used_bytes": used}, "disk": {"used_bytes": 0}},
        "counters": {"bytes_parked": copied, "bytes_restored": 0},
    }


def test_each_client_is_set_against_plain_and_the_pool_against_one_copy_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = VllmBenchSpec(workload="shared-prefix", clients=("agentpark", "session-id", "none"))
    plain = RunResult("plain", 9.0, _turns([1000, 900, 900], 0.8))
    before = _host(0, 0, 0, 0)
    runs = [
        RunResult("reference", 4.0, _turns([1000, 100, 100], 0.1)),
        plain,
        RunResult(
            "agentpark",
            5.0,
            _turns([1000, 100, 100], 0.2),
            _host(16, 16 << 20, 4 << 20, 20 << 20),
            client="agentpark",
            host_before=before,
        ),
        RunResult(
            "agentpark",
            5.0,
            _turns([1000, 150, 100], 0.4),
            _host(16, 16 << 20, 4 << 20, 20 << 20),
            client="session-id",
            host_before=before,
        ),
        RunResult(
            "agentpark", 8.0, _turns([1000, 900, 900], 0.8), _host(0, 0, 0, 0), host_before=before
        ),
    ]
    assert ratios(runs[2], plain) == (2800 / 1200, 4.0)
    assert ratios(runs[3], plain) == (2800 / 1250, 2.0)
    assert ratios(runs[4], plain) == (1.0, 1.0)
    print_report(runs, spec, 48)
    out = capsys.readouterr().out
    assert "agentpark/agentpark vs plain: 2.33x fewer prefill tokens (target >= 2)" in out
    assert "agentpark/session-id vs plain: 2.24x fewer prefill tokens (target >= 2)" in out
    assert "agentpark/none vs plain: 1.00x fewer prefill tokens (target >= 1.6)" in out
    assert "2.00x lower p50 TTFT after a tool" in out
    assert "(target >= 4x)" in out  # the shared prefix's target, in the pool table's title
    pool = out.split("the pool at the end")[1]
    row = next(line for line in pool.splitlines() if "agentpark/session-id" in line)
    # 16 sessions in 4 MiB against 16 MiB one copy each: 4x; 4096 (1024) sessions per GiB.
    for cell in ("16", "4.0", "16.0", "4.00x", "4096.0 (1024.0)", "20.0"):
        assert cell in [c.strip() for c in row.split("│")], cell


def test_pool_figures_are_the_run_s_own() -> None:
    before = _host(2, 1 << 20, 3 << 20, 5 << 20)  # a daemon that held something already
    figures = pool_figures(before, _host(8, 8 << 20, 5 << 20, 9 << 20))
    assert figures is not None
    assert (figures.sessions, figures.held_bytes, figures.one_copy_bytes) == (8, 2 << 20, 8 << 20)
    assert figures.copied_bytes == 4 << 20
    assert figures.fewer == 4.0
    assert figures.per_gib(GIB // 2) == 16.0
    assert pool_figures({}, {}) is None  # plain vLLM: no daemon
    empty = pool_figures(before, before)
    assert empty is not None and math.isnan(empty.fewer) and math.isnan(empty.per_gib(0))


def test_a_restored_turn_that_differs_fails_the_exact_bench_in_any_clients_run() -> None:
    reference = RunResult("reference", 1.0, _turns([1000, 100], 0.1))
    same = RunResult("agentpark", 1.0, _turns([1000, 100], 0.1), client="agentpark")
    differs = RunResult("agentpark", 1.0, _turns([1000, 100], 0.1), client="session-id")
    differs.turns[1].logprobs = [-1.5]
    differs.turns[1].restored_bytes = 4096
    exact = VllmBenchSpec(max_num_seqs=1, clients=("agentpark", "session-id"))
    assert not failed([reference, same], exact)
    assert failed([reference, same, differs], exact)
    assert not failed([reference, same, differs], VllmBenchSpec())  # batched: counted only
