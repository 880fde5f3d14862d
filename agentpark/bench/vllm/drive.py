"""The agents of ``agentpark bench vllm`` against one vLLM server: streamed greedy chat
completions, the tool calls written by the client, the pauses slept, TTFT per turn."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from agentpark.bench.vllm.results import TurnResult
from agentpark.bench.vllm.spec import VllmBenchSpec
from agentpark.bench.vllm.workload import AgentPlan
from agentpark.vllm_tools.process import VllmServer

__all__ = ["Clock", "drive"]


class Clock:
    def __init__(self) -> None:
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {text}", file=sys.stderr, flush=True)


async def _turn(
    client: Any,
    model: str,
    plan: AgentPlan,
    messages: list[dict[str, Any]],
    turn: int,
    spec: VllmBenchSpec,
    ready_at: float,
    agent: int,
) -> TurnResult:
    hint: dict[str, Any] = {"session_id": plan.session_id}
    if turn < len(plan.steps):
        step = plan.steps[turn]
        hint |= {"tool": step.tool, "expected_resume_s": step.median_s}
    first: float | None = None
    tokens: list[str] = []
    logprobs: list[float] = []
    usage: Any = None
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=spec.new_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            logprobs=True,
            extra_body={"ignore_eos": True, "kv_transfer_params": {"agentpark": hint}},
        )
        async for chunk in stream:
            for choice in chunk.choices:
                content = choice.logprobs.content if choice.logprobs else None
                if content:
                    if first is None:
                        first = time.monotonic()
                    tokens += [c.token for c in content]
                    logprobs += [c.logprob for c in content]
            if chunk.usage is not None:
                usage = chunk.usage
    except Exception as exc:  # counted and printed; the bench exits 1
        return TurnResult(agent, turn, turn > 0, 0.0, 0, 0, [], [], error=repr(exc))
    if usage is None or first is None:
        return TurnResult(agent, turn, turn > 0, 0.0, 0, 0, tokens, logprobs, error="no usage")
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    return TurnResult(
        agent,
        turn,
        turn > 0,
        first - ready_at,
        usage.prompt_tokens,
        cached,
        tokens,
        logprobs,
    )


async def _agent(
    client: Any,
    model: str,
    plan: AgentPlan,
    spec: VllmBenchSpec,
    agent: int,
    done: list[TurnResult],
    clock: Clock,
    total: int,
) -> None:
    messages = [dict(m) for m in plan.messages]
    ready_at = time.monotonic()
    for turn in range(spec.turns):
        result = await _turn(client, model, plan, messages, turn, spec, ready_at, agent)
        done.append(result)
        if len(done) % max(1, total // 10) == 0 or len(done) == total:
            clock.say(f"  {len(done)}/{total} turns answered")
        if turn == len(plan.steps):
            return
        step = plan.steps[turn]
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": step.call_id,
                        "type": "function",
                        "function": {"name": step.tool, "arguments": step.arguments},
                    }
                ],
            }
        )
        await asyncio.sleep(step.pause_s)  # the tool runs
        messages.append({"role": "tool", "tool_call_id": step.call_id, "content": step.result})
        ready_at = time.monotonic()


async def drive(
    server: VllmServer, plans: list[AgentPlan], spec: VllmBenchSpec, clock: Clock
) -> tuple[float, list[TurnResult]]:
    from openai import AsyncOpenAI

    done: list[TurnResult] = []
    total = sum(len(p.steps) + 1 for p in plans)
    async with AsyncOpenAI(
        base_url=server.base_url, api_key="unused", max_retries=0, timeout=1800
    ) as client:
        (model,) = [m.id async for m in client.models.list()]
        started = time.monotonic()
        await asyncio.gather(
            *(_agent(client, model, p, spec, i, done, clock, total) for i, p in enumerate(plans))
        )
        return time.monotonic() - started, sorted(done, key=lambda t: (t.agent, t.turn))
