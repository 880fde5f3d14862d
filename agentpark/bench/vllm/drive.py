"""The agents of ``agentpark bench vllm`` against one vLLM server: streamed greedy chat
completions, the tool calls written by the client, the pauses slept, TTFT per turn; or the
multi-turn workload's conversations, sent by ``concurrency`` clients in turn.

How a request names its session is the run's client (spec.CLIENTS): ``agentpark`` sends
``kv_transfer_params.agentpark`` (the session, the tool that follows and its median as
``expected_resume_s``); ``session-id`` sends only the ``X-Session-ID`` header, as vLLM's
multi-turn benchmark does with --send-conversation-id (vLLM 0.32 reads it as
``request.session_id``); ``none`` sends only the messages."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from agentpark.bench.vllm.results import TurnResult
from agentpark.bench.vllm.spec import VllmBenchSpec
from agentpark.bench.vllm.workload import AgentPlan
from agentpark.vllm_tools.process import VllmServer

__all__ = ["Clock", "drive", "naming"]


class Clock:
    def __init__(self) -> None:
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {text}", file=sys.stderr, flush=True)


def naming(client: str, plan: AgentPlan, turn: int) -> dict[str, Any]:
    """What the request carries besides the messages, as keyword arguments of the OpenAI
    SDK's ``create`` (``extra_body`` and ``extra_headers``), for ``client``."""
    body: dict[str, Any] = {"ignore_eos": True}
    if client == "agentpark":
        hint: dict[str, Any] = {"session_id": plan.session_id}
        step = plan.steps[turn] if turn < len(plan.steps) else None
        if step is not None and step.tool is not None:
            hint |= {"tool": step.tool, "expected_resume_s": step.median_s}
        body["kv_transfer_params"] = {"agentpark": hint}
    if client == "session-id":
        return {"extra_body": body, "extra_headers": {"X-Session-ID": plan.session_id}}
    return {"extra_body": body}


@dataclass
class _Driver:
    """One run's requests: the OpenAI client, how it names sessions, the turns answered."""

    client: Any
    model: str
    spec: VllmBenchSpec
    naming_as: str
    clock: Clock
    total: int
    done: list[TurnResult] = field(default_factory=list)

    async def turn(
        self,
        plan: AgentPlan,
        messages: list[dict[str, Any]],
        agent: int,
        turn: int,
        ready_at: float,
    ) -> None:
        """One streamed turn; its TTFT counts from ``ready_at`` (the tool returned, or a
        client picked the conversation up)."""
        result = await self._send(plan, messages, agent, turn, ready_at)
        self.done.append(result)
        if len(self.done) % max(1, self.total // 10) == 0 or len(self.done) == self.total:
            self.clock.say(f"  {len(self.done)}/{self.total} turns answered")

    async def _send(
        self,
        plan: AgentPlan,
        messages: list[dict[str, Any]],
        agent: int,
        turn: int,
        ready_at: float,
    ) -> TurnResult:
        first: float | None = None
        tokens: list[str] = []
        logprobs: list[float] = []
        usage: Any = None
        request_id = ""
        try:
            stream = await self.client.chat.completions.create(
                model=self.model,
                messages=messages,
                max_tokens=self.spec.new_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                logprobs=True,
                **naming(self.naming_as, plan, turn),
            )
            async for chunk in stream:
                request_id = request_id or chunk.id
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
            return TurnResult(agent, turn, turn > 0, 0.0, 0, 0, tokens, logprobs, "no usage")
        details = usage.prompt_tokens_details
        cached = (details.cached_tokens or 0) if details is not None else 0
        prompt = usage.prompt_tokens
        ttft = first - ready_at
        return TurnResult(
            agent, turn, turn > 0, ttft, prompt, cached, tokens, logprobs, request_id=request_id
        )

    async def agent(self, plan: AgentPlan, agent: int) -> None:
        """An agent: a turn, the tool's pause, the tool's result; all turns."""
        messages = [dict(m) for m in plan.messages]
        ready_at = time.monotonic()
        for turn in range(len(plan.steps) + 1):
            await self.turn(plan, messages, agent, turn, ready_at)
            if turn == len(plan.steps):
                return
            step = plan.steps[turn]
            messages.append(step.assistant())
            await asyncio.sleep(step.pause_s)  # the tool runs
            messages.append(step.follow())
            ready_at = time.monotonic()

    async def conversations(self, plans: list[AgentPlan]) -> None:
        """vLLM's multi-turn benchmark's client loop: ``concurrency`` clients, each takes the
        next active conversation, sends its next turn, and puts it back at the end of the
        line: a conversation waits for the others' turns, long enough to be evicted."""
        line = deque((i, [dict(m) for m in p.messages], 0) for i, p in enumerate(plans))

        async def client() -> None:
            while line:
                agent, messages, turn = line.popleft()
                plan = plans[agent]
                await self.turn(plan, messages, agent, turn, time.monotonic())
                if turn < len(plan.steps):
                    step = plan.steps[turn]
                    messages += [step.assistant(), step.follow()]
                    line.append((agent, messages, turn + 1))

        await asyncio.gather(*(client() for _ in range(self.spec.concurrency)))


async def drive(
    server: VllmServer, plans: list[AgentPlan], spec: VllmBenchSpec, client: str, clock: Clock
) -> tuple[float, list[TurnResult]]:
    """Every plan's turns against ``server``, sessions named as ``client`` names them:
    (makespan, the turns by agent and turn)."""
    from openai import AsyncOpenAI

    total = sum(len(p.steps) + 1 for p in plans)
    async with AsyncOpenAI(
        base_url=server.base_url, api_key="unused", max_retries=0, timeout=1800
    ) as openai:
        (model,) = [m.id async for m in openai.models.list()]
        driver = _Driver(openai, model, spec, client, clock, total)
        started = time.monotonic()
        if spec.workload == "multi-turn":
            await driver.conversations(plans)
        else:
            await asyncio.gather(*(driver.agent(p, i) for i, p in enumerate(plans)))
        done = sorted(driver.done, key=lambda t: (t.agent, t.turn))
        return time.monotonic() - started, done
