"""What ``agentpark vllm demo`` prints: per turn, the tokens vLLM did not compute and where
they came from (agentpark's pool, vLLM's own prefix cache, or nowhere: recomputed) and the
time to first token, with agentpark and without; then two summary lines."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agentpark.bench.vllm.results import RunResult, TurnResult

__all__ = ["DemoRow", "Side", "render", "rows_of", "summary"]

# (agent, turn) -> (tokens agentpark restored into the turn, the tier they came from).
Restored = Mapping[tuple[int, int], tuple[int, str | None]]


@dataclass(frozen=True)
class Side:
    """One turn in one run."""

    prompt_tokens: int
    cached_tokens: int  # what vLLM did not compute (its prefix cache and agentpark's)
    agentpark_tokens: int  # of those, restored from agentpark
    tier: str | None  # agentpark's tier they came from
    ttft_s: float
    error: str | None = None

    @property
    def prefix_cache(self) -> int:
        return max(0, self.cached_tokens - self.agentpark_tokens)

    @property
    def computed(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    def source(self) -> str:
        """Where the tokens it did not compute came from."""
        if self.error is not None:
            return "failed"
        tier = f"agentpark {self.tier or 'pool'}"
        if self.agentpark_tokens and self.prefix_cache:
            return f"{tier} + vLLM cache"
        if self.agentpark_tokens:
            return tier
        return "vLLM prefix cache" if self.prefix_cache else "recomputed"

    @classmethod
    def of(cls, turn: TurnResult, restored: tuple[int, str | None]) -> Side:
        tokens, tier = restored
        return cls(turn.prompt_tokens, turn.cached_tokens, tokens, tier, turn.ttft_s, turn.error)


@dataclass(frozen=True)
class DemoRow:
    agent: int
    turn: int
    with_agentpark: Side
    without: Side


def rows_of(with_run: RunResult, plain: RunResult, restored: Restored) -> list[DemoRow]:
    """One row per turn of either run, by agent and turn (the same seeded workload)."""
    plain_turns = {(t.agent, t.turn): t for t in plain.turns}
    rows = []
    for turn in sorted(with_run.turns, key=lambda t: (t.agent, t.turn)):
        other = plain_turns.get((turn.agent, turn.turn))
        if other is None:
            continue
        key = (turn.agent, turn.turn)
        rows.append(
            DemoRow(
                turn.agent,
                turn.turn,
                Side.of(turn, restored.get(key, (0, None))),
                Side.of(other, (0, None)),  # plain vLLM: no agentpark
            )
        )
    return rows


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms"


def render(rows: Sequence[DemoRow]) -> str:
    """The per-turn table, plain text (it reads the same in a log as on a terminal)."""
    head = f"{'session':<8} {'turn':>4} {'prompt':>6} "
    side = f"{'restored':>8}  {'from where':<26} {'TTFT':>9}"
    lines = [
        f"{'':<21} {'with agentpark':-^45}   {'plain vLLM (same KV cache)':-^45}",
        f"{head} {side}   {side}",
    ]
    for row in rows:
        cells = [f"agent-{row.agent:<2} {row.turn:>4} {row.with_agentpark.prompt_tokens:>6} "]
        for one in (row.with_agentpark, row.without):
            cells.append(f"{one.cached_tokens:>8}  {one.source():<26} {_ms(one.ttft_s):>9}")
        lines.append(f"{cells[0]} {cells[1]}   {cells[2]}")
    return "\n".join(lines)


def _median_after_tool(sides: Sequence[Side]) -> float | None:
    values = [s.ttft_s for s in sides if s.error is None]
    return statistics.median(values) if values else None


def summary(rows: Sequence[DemoRow]) -> list[str]:
    """Two lines: prefill tokens computed with and without agentpark (and the turns it
    restored), then the median time to first token of the turns after a tool."""
    computed = sum(r.with_agentpark.computed for r in rows)
    plain = sum(r.without.computed for r in rows)
    fewer = f" ({plain / computed:.1f}x fewer)" if computed else ""
    restored = [r for r in rows if r.with_agentpark.agentpark_tokens]
    tokens = sum(r.with_agentpark.agentpark_tokens for r in restored)
    later = [r for r in rows if r.turn > 0]
    first = (
        f"prefill tokens computed: {computed:,} with agentpark, {plain:,} without{fewer}; "
        f"{len(restored)} of {len(later)} turns after a tool restored from agentpark "
        f"({tokens:,} tokens)"
    )
    with_ttft = _median_after_tool([r.with_agentpark for r in later])
    plain_ttft = _median_after_tool([r.without for r in later])
    if with_ttft is None or plain_ttft is None:
        return [first, "median TTFT after a tool: no turn after a tool answered in both runs"]
    ratio = f" ({plain_ttft / with_ttft:.1f}x lower)" if with_ttft > 0 else ""
    second = (
        f"median TTFT after a tool: {_ms(with_ttft)} with agentpark, "
        f"{_ms(plain_ttft)} without{ratio}"
    )
    return [first, second]
