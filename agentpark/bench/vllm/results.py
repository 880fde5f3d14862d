"""What one turn and one run of ``agentpark bench vllm`` measured."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentpark.bench.vllm.spec import TURN_ENDS

__all__ = ["RunResult", "TurnResult"]


@dataclass
class TurnResult:
    agent: int
    turn: int
    after_tool: bool
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    tokens: list[str]
    logprobs: list[float]
    error: str | None = None
    # Bytes agentpark restored into this turn (from the daemon's events after the run:
    # streamed responses carry no kv_transfer_params in vLLM 0.32).
    restored_bytes: int = 0
    # The id the client saw (the stream's ``chatcmpl-...``): the daemon's turns name it.
    request_id: str = ""


@dataclass
class RunResult:
    name: str  # reference, plain, or an agentpark run (spec.TURN_ENDS: park, pin, ...)
    makespan_s: float
    turns: list[TurnResult]
    host: dict[str, Any] = field(default_factory=dict)  # the daemon's /v1/host at the end
    decisions: dict[str, int] = field(default_factory=dict)
    client: str = "none"  # how the requests named their sessions (spec.CLIENTS)
    host_before: dict[str, Any] = field(default_factory=dict)  # /v1/host before the run

    @property
    def label(self) -> str:
        """The run as the report names it: an agentpark run by its client too
        (``adaptive/session-id``); plain and reference send the messages only."""
        return f"{self.name}/{self.client}" if self.with_agentpark else self.name

    @property
    def with_agentpark(self) -> bool:
        """Whether a daemon stood behind the connector (a turn-end rule's run)."""
        return self.name in TURN_ENDS

    @property
    def prefill_computed(self) -> int:
        return sum(t.prompt_tokens - t.cached_tokens for t in self.turns)

    def ttfts(self) -> list[float]:
        return [t.ttft_s for t in self.turns if t.after_tool and t.error is None]

    def errors(self) -> list[TurnResult]:
        return [t for t in self.turns if t.error is not None]
