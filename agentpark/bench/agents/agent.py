"""One agent of ``agentpark bench agents`` over HTTP: its turns, its tool calls and what
its policy does at each (pause, delete and re-prefill, nothing), retries on 507 and 409
included; and keep-all's FIFO admission."""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from agentpark.bench.agents.results import AgentResult
from agentpark.bench.agents.workload import ADAPTIVE, ALWAYS_PARK, RECOMPUTE, AgentPlan, ToolCall

__all__ = ["Aborted", "Agent", "BlockBudget", "Shared"]

BACKOFF_START_S = 0.004
BACKOFF_MAX_S = 0.064
BUSY_BACKOFF_S = 0.002


class Aborted(Exception):
    """The run was stopped (an agent failed, or the time limit passed)."""


class _PoolFull(Exception):
    """507 pool_full where the caller asked to handle it itself."""


class BlockBudget:
    """keep-all's admission: FIFO reservations of pool blocks."""

    def __init__(self, total: int) -> None:
        self.free = total
        self._cond = threading.Condition()
        self._queue: deque[object] = deque()

    def acquire(self, n: int, stop: threading.Event) -> float:
        """Reserve ``n`` blocks once every earlier caller has; seconds waited."""
        started = time.perf_counter()
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            try:
                while not (self._queue[0] is ticket and self.free >= n):
                    if stop.is_set():
                        raise Aborted
                    self._cond.wait(0.05)
            except BaseException:
                self._queue.remove(ticket)
                self._cond.notify_all()
                raise
            self._queue.popleft()
            self.free -= n
            self._cond.notify_all()
        return time.perf_counter() - started

    def release(self, n: int) -> None:
        with self._cond:
            self.free += n
            self._cond.notify_all()


@dataclass
class Shared:
    """What every agent of one policy run shares."""

    policy: str
    client: httpx.Client
    block_size: int
    go: threading.Event
    stop: threading.Event
    budget: BlockBudget | None
    on_turn: Callable[[], None]


class Agent:
    def __init__(self, shared: Shared, plan: AgentPlan, seed: int) -> None:
        self.s = shared
        self.plan = plan
        self.result = AgentResult(plan.index)
        self.history: list[int] = []  # every token of the conversation so far
        self.sid = ""
        self._generation = 0
        self._jitter = random.Random(seed * 1_000_003 + plan.index)  # not the workload's rng

    # -- the loop --------------------------------------------------------------------------

    def __call__(self) -> None:
        try:
            self._run()
        except Aborted:
            self.result.error = self.result.error or "aborted (another agent failed, or timeout)"
        except Exception as exc:
            self.result.error = f"{type(exc).__name__}: {exc}"
            self.s.stop.set()
        finally:
            self.result.finished_at = time.perf_counter()

    def _run(self) -> None:
        plan, policy = self.plan, self.s.policy
        self.s.go.wait()
        reserved = 0
        if self.s.budget is not None:
            reserved = -(-plan.final_tokens // self.s.block_size)
            self.result.admission_wait_s = self.s.budget.acquire(reserved, self.s.stop)
        try:
            self._new_session()
            self._turn(plan.prompt, None)
            for call in plan.calls:
                started = time.perf_counter()
                self._tool_starts(call)
                returns_at = started + call.duration_s
                remaining = returns_at - time.perf_counter()
                if remaining > 0 and self.s.stop.wait(remaining):
                    raise Aborted
                if policy == RECOMPUTE:
                    self._new_session()
                self._turn(call.result, returns_at)
            self._delete()
        finally:
            if self.s.budget is not None and reserved:
                self.s.budget.release(reserved)

    def _turn(self, tokens: Sequence[int], returned_at: float | None) -> None:
        """Send the input, generate new_tokens: the first alone (TTFT), then the rest."""
        res = self.result
        if self.s.policy == RECOMPUTE and returned_at is not None:
            first = self._generate([*self.history, *tokens], 1)  # the re-prefill
            res.recreated += 1
        else:
            first = self._generate(tokens, 1)
        if returned_at is not None:
            res.ttft_s.append(time.perf_counter() - returned_at)
        self.history.extend(tokens)
        self.history.extend(first["tokens"])
        rest = self._follow_up(self.plan.new_tokens - 1)
        self.history.extend(rest["tokens"])
        out = [*first["tokens"], *rest["tokens"]]
        if len(out) != self.plan.new_tokens:
            res.short.append(f"turn {res.turns_done} gave {len(out)} tokens")
        res.outputs.append(out)
        res.num_tokens = int(rest["num_tokens"])
        res.turns_done += 1
        self.s.on_turn()

    def _follow_up(self, n: int) -> dict[str, Any]:
        if self.s.policy != RECOMPUTE:
            return self._generate([], n)
        try:
            return self._generate([], n, on_full=_PoolFull)
        except _PoolFull:
            # Preempt by recompute: drop the KV, come back with the whole history.
            self.result.preempted += 1
            self._delete()
            self._new_session()
            return self._generate(self.history, n)

    def _tool_starts(self, call: ToolCall) -> None:
        policy = self.s.policy
        if policy == RECOMPUTE:
            self._delete()
        elif policy == ALWAYS_PARK:
            self._pause({"tool": call.tool.name, "force": True})
        elif policy == ADAPTIVE:
            body: dict[str, Any] = {"tool": call.tool.name}
            if call.hint_s is not None:
                body["expected_resume_s"] = call.hint_s
            self._pause(body)

    # -- HTTP ------------------------------------------------------------------------------

    def _new_session(self) -> None:
        self.sid = f"agent-{self.plan.index:04d}-{self._generation}"
        self._generation += 1
        self._call("POST", "/v1/sessions", {"session_id": self.sid}, ok=(201,))
        self.result.session_ids.append(self.sid)

    def _delete(self) -> None:
        self._call("DELETE", f"/v1/sessions/{self.sid}", None, ok=(204,))

    def _pause(self, body: dict[str, Any]) -> None:
        response = self._call(
            "POST", f"/v1/sessions/{self.sid}/pause", body, ok=(200,), tier_full_ok=True
        )
        if response.status_code == 507:
            self.result.pause_refused += 1
        elif response.json()["decision"] == "kept":
            self.result.kept += 1
        else:
            self.result.parked += 1

    def _generate(
        self, tokens: Sequence[int], n: int, on_full: type[Exception] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"max_new_tokens": n}
        if tokens:
            body["prompt_tokens"] = list(tokens)
        path = f"/v1/sessions/{self.sid}/generate"
        res = self.result
        delay = BACKOFF_START_S
        while True:
            response = self.s.client.post(path, json=body)
            if response.status_code == 200:
                out: dict[str, Any] = response.json()
                if out.get("restored_from"):
                    where = str(out["restored_from"])
                    res.restored[where] = res.restored.get(where, 0) + 1
                return out
            if _code(response) == "pool_full":
                if on_full is not None:
                    raise on_full
                res.full_waits += 1
                waited = delay * self._jitter.uniform(0.5, 1.5)
                res.full_wait_s += waited
                if self.s.stop.wait(waited):
                    raise Aborted
                delay = min(delay * 2, BACKOFF_MAX_S)
            elif _code(response) == "session_busy":  # a policy action holds it briefly
                res.busy_retries += 1
                if self.s.stop.wait(BUSY_BACKOFF_S):
                    raise Aborted
            else:
                raise RuntimeError(f"generate {self.sid}: {_describe(response)}")

    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        ok: tuple[int, ...],
        tier_full_ok: bool = False,
    ) -> httpx.Response:
        while True:
            response = self.s.client.request(method, path, json=body)
            if response.status_code in ok:
                return response
            if tier_full_ok and _code(response) == "tier_full":
                return response
            if _code(response) != "session_busy":
                raise RuntimeError(f"{method} {path}: {_describe(response)}")
            self.result.busy_retries += 1
            if self.s.stop.wait(BUSY_BACKOFF_S):
                raise Aborted


def _code(response: httpx.Response) -> str | None:
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return str(code)


def _describe(response: httpx.Response) -> str:
    return f"HTTP {response.status_code}: {response.text[:300]}"
