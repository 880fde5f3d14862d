"""``agentpark bench vllm``'s workloads without vLLM: each a function of its seed, and the
shapes promised (the shared system prompt, vLLM's multi-turn shape), sized by a tokenizer
whose tokens are characters (exact counts, no model needed)."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from agentpark.bench.vllm import VllmBenchSpec
from agentpark.bench.vllm.conversations import REQUEST, conversation_prefix, make_conversations
from agentpark.bench.vllm.spec import BLOCK_SIZE, TOOLS
from agentpark.bench.vllm.workload import MESSAGE_OVERHEAD, AgentPlan, make_plans, prompt_tokens
from agentpark.vllm_tools.model import corpus_files
from tests.bench.tokens import TOKENIZER

SMALL = {"agents": 3, "turns": 3}


@pytest.mark.parametrize("workload", ["agents", "shared-prefix", "multi-turn"])
def test_each_workload_is_a_function_of_its_seed(workload: str) -> None:
    spec = VllmBenchSpec(workload=workload, **SMALL)  # type: ignore[arg-type]
    plans = make_plans(spec, TOKENIZER)
    assert plans == make_plans(spec, TOKENIZER)
    assert plans != make_plans(replace(spec, seed=1), TOKENIZER)
    assert len(plans) == 3 and all(len(p.steps) == 2 for p in plans)
    assert len({p.session_id for p in plans}) == 3


def test_agents_have_a_system_prompt_each_and_tools_between_turns() -> None:
    spec = VllmBenchSpec(**SMALL)  # type: ignore[arg-type]
    plans = make_plans(spec, TOKENIZER)
    systems = [p.messages[0]["content"] for p in plans]
    assert len(set(systems)) == 3
    for agent, plan in enumerate(plans):
        assert plan.messages[1] == {
            "role": "user",
            "content": f"Task {agent}: make the tests pass.",
        }
        assert spec.context[0] - 60 <= len(systems[agent]) <= spec.context[1]
        for step in plan.steps:
            assert step.tool in TOOLS
            assert step.assistant()["tool_calls"][0]["function"]["name"] == step.tool
            assert step.follow() == {
                "role": "tool",
                "tool_call_id": step.call_id,
                "content": step.result,
            }
            assert spec.result[0] <= len(step.result) <= spec.result[1]


def test_shared_prefix_agents_send_one_system_prompt_of_the_size_asked() -> None:
    spec = VllmBenchSpec(workload="shared-prefix", agents=4, turns=2, system_tokens=2048)
    plans = make_plans(spec, TOKENIZER)
    systems = {p.messages[0]["content"] for p in plans}
    assert len(systems) == 1
    assert len(systems.pop()) == 2048
    tasks = [p.messages[1]["content"] for p in plans]
    assert len(set(tasks)) == 4  # each agent's own task after the shared prompt
    for agent, task in enumerate(tasks):
        head = f"Task {agent}: make the tests pass.\n"
        assert task.startswith(head)
        assert spec.task[0] <= len(task) - len(head) <= spec.task[1]


def test_multi_turn_conversations_have_vllms_shape() -> None:
    spec = VllmBenchSpec(workload="multi-turn", agents=5, turns=4)
    plans = make_conversations(spec, TOKENIZER, corpus_files())
    firsts = [p.messages[0]["content"] for p in plans]
    common = firsts[0][: spec.common_prefix_tokens]
    for conversation, (plan, first) in enumerate(zip(plans, firsts, strict=True)):
        assert [m["role"] for m in plan.messages] == ["user"]  # no system prompt, no tools
        assert first.startswith(common)  # the common prefix, in every conversation
        marker = f"{conversation} is a nice number... {conversation}, "
        assert first[spec.common_prefix_tokens :].startswith(marker)
        own = len(first) - spec.common_prefix_tokens - len(marker)  # prefix + first turn
        low, high = spec.user_tokens
        assert 1 + low <= own <= 2 * spec.conversation_prefix_tokens + high
        assert len(plan.steps) == spec.turns - 1
        for step in plan.steps:
            assert step.tool is None and step.pause_s == 0
            assert step.assistant() == {"role": "assistant", "content": step.answer}
            assert step.follow() == {"role": "user", "content": step.result}
            assert step.result.startswith(REQUEST)
            assert low <= len(step.result) <= high
            assert spec.answer_tokens[0] <= len(step.answer) <= spec.answer_tokens[1]
    # The common prefix is shared; what follows it is each conversation's own.
    assert len({f[spec.common_prefix_tokens : spec.common_prefix_tokens + 40] for f in firsts}) == 5


def test_the_default_multi_turn_holds_more_conversations_than_the_kv_cache() -> None:
    spec = VllmBenchSpec(workload="multi-turn")
    plans = make_plans(spec, TOKENIZER)
    longest = [prompt_tokens(p, TOKENIZER) for p in plans]
    assert max(longest) + spec.new_tokens <= spec.max_model_len  # each one fits
    assert sum(longest) > 2 * spec.small_blocks() * BLOCK_SIZE  # all of them do not


def test_a_conversation_prefix_is_lognormal_around_its_average_and_capped() -> None:
    import random

    rng = random.Random(0)
    drawn = [conversation_prefix(rng, 1000) for _ in range(4000)]
    assert min(drawn) >= 1 and max(drawn) == 2000  # capped at twice the average
    assert 900 <= statistics.mean(drawn) <= 1000  # the cap trims the mean a little
    assert 800 <= statistics.median(drawn) <= 900  # vLLM's median: 0.85 x the average


def test_prompt_tokens_counts_the_last_prompt() -> None:
    spec = VllmBenchSpec(workload="multi-turn", agents=1, turns=3)
    (plan,) = make_plans(spec, TOKENIZER)
    contents = [plan.messages[0]["content"]]
    for step in plan.steps:
        contents += [step.answer, step.result]
    assert prompt_tokens(plan, TOKENIZER) == sum(map(len, contents)) + 5 * MESSAGE_OVERHEAD
    tools = make_plans(VllmBenchSpec(agents=1, turns=2), TOKENIZER)[0]
    assert isinstance(tools, AgentPlan)
    call = tools.steps[0].assistant()["tool_calls"][0]["function"]
    assert prompt_tokens(tools, TOKENIZER) > sum(len(m["content"]) for m in tools.messages) + len(
        call["arguments"]
    )
