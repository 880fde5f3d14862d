"""The turn-end rules side by side (issue 20's table): each run's prefill computed against
plain and against the roomy reference (the keep-all ideal), its time to first token after
a tool, and what the daemon answered at the turn ends, by kind; then the adaptive rule's
targets, each said met or not."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentpark.bench.vllm.compare import by_kind
from agentpark.bench.vllm.results import RunResult

__all__ = ["Variant", "variants", "variants_table", "verdict_flags", "verdicts"]

NAN = float("nan")
WITHIN_REFERENCE = 0.05  # adaptive: at most 5% more prefill than the reference
FEWER_THAN_PLAIN = 2.0  # adaptive: >= 2x fewer prefill tokens than plain
TTFT_THAN_PLAIN = 2.0  # adaptive: p50 TTFT after a tool >= 2x lower than plain's


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else NAN


@dataclass(frozen=True)
class Variant:
    """One run's row: its figures against plain and the reference."""

    label: str
    name: str
    client: str
    prefill: int
    vs_plain: float  # plain's prefill / this run's: times fewer
    over_reference: float  # this run's prefill / the reference's - 1: 0.07 is 7% more
    ttft_p50: float
    ttft_p99: float
    ttft_vs_plain: float  # plain's p50 / this run's: times lower
    turn_ends: dict[str, int] = field(default_factory=dict)  # compare.by_kind


def variants(results: Sequence[RunResult]) -> list[Variant]:
    """Every run's row (the reference's and plain's against themselves)."""
    by_name = {r.label: r for r in results}
    reference, plain = by_name.get("reference"), by_name.get("plain")
    rows = []
    for run in results:
        ttfts = run.ttfts()
        p50, p99 = (statistics.median(ttfts), _quantile(ttfts, 0.99)) if ttfts else (NAN, NAN)
        plain_ttfts = plain.ttfts() if plain else []
        rows.append(
            Variant(
                run.label,
                run.name,
                run.client,
                run.prefill_computed,
                plain.prefill_computed / run.prefill_computed
                if plain and run.prefill_computed
                else NAN,
                run.prefill_computed / reference.prefill_computed - 1
                if reference and reference.prefill_computed
                else NAN,
                p50,
                p99,
                statistics.median(plain_ttfts) / p50 if plain_ttfts and p50 > 0 else NAN,
                by_kind(run.decisions) if run.with_agentpark else {},
            )
        )
    return rows


def _x(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}x"


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 100:+.1f}%"


def _s(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def _released(turn_ends: dict[str, int]) -> str:
    parts = [
        f"{label.removeprefix('released: ')} {n}"
        for label, n in sorted(turn_ends.items())
        if label.startswith("released: ")
    ]
    return ", ".join(parts) or "0"


def _ended(turn_ends: dict[str, int]) -> str:
    parts = [
        f"{label.removeprefix('unpin: ')} {n}"
        for label, n in sorted(turn_ends.items())
        if label.startswith("unpin: ")
    ]
    return ", ".join(parts) or "0"


def variants_table(results: Sequence[RunResult], blocks: int) -> Any:
    """The rich table of :func:`variants`."""
    from rich.table import Table

    table = Table(title=f"turn-end rules at {blocks} blocks: prefill, TTFT after a tool, answers")
    table.caption = (
        "vs plain: times fewer prefill tokens; vs reference: more prefill than the roomy "
        "keep-all reference; TTFT from the tool's return; pins released under pressure are "
        "parked or dropped; pins ended by cause (return, timeout, pressure, ...)"
    )
    table.add_column("run", no_wrap=True)
    for column in (
        "prefill computed",
        "vs plain",
        "vs reference",
        "TTFT p50 / p99 (s)",
        "p50 vs plain",
        "pinned",
        "parked",
        "dropped",
        "kept",
        "released (pressure)",
        "pins ended",
    ):
        table.add_column(column, justify="right")
    for row in variants(results):
        ends = row.turn_ends
        copies = ends.get("copies behind pins", 0)
        pinned = f"{ends.get('pinned', 0)}" + (f" ({copies} copied)" if copies else "")
        answers = (
            [
                pinned,
                *(str(ends.get(k, 0)) for k in ("parked", "dropped", "kept")),
                _released(ends),
                _ended(ends),
            ]
            if ends
            else ["-"] * 6
        )
        table.add_row(
            row.label,
            f"{row.prefill:,}",
            "-" if row.name == "plain" else _x(row.vs_plain),
            "-" if row.name == "reference" else _pct(row.over_reference),
            f"{_s(row.ttft_p50)} / {_s(row.ttft_p99)}",
            "-" if row.name == "plain" else _x(row.ttft_vs_plain),
            *answers,
        )
    return table


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _judged(results: Sequence[RunResult]) -> list[tuple[str, str, bool, str]]:
    """(adaptive run, target, met, the line that says it) for every target of issue 20."""
    rows = variants(results)
    judged = []
    for row in (r for r in rows if r.name == "adaptive"):
        near = row.over_reference <= WITHIN_REFERENCE
        fewer = row.vs_plain >= FEWER_THAN_PLAIN
        faster = row.ttft_vs_plain >= TTFT_THAN_PLAIN
        judged.append(
            (
                row.label,
                "plain and reference",
                near and fewer and faster,
                f"{row.label}: {_pct(row.over_reference)} prefill vs the reference "
                f"(target <= +{WITHIN_REFERENCE:.0%}: {_met(near)}), "
                f"{_x(row.vs_plain)} fewer than plain (target >= {FEWER_THAN_PLAIN:g}x: "
                f"{_met(fewer)}), p50 TTFT after a tool "
                f"{_x(row.ttft_vs_plain)} lower than plain (target >= {TTFT_THAN_PLAIN:g}x: "
                f"{_met(faster)})",
            )
        )
        for other in (r for r in rows if r.client == row.client and r.name in ("park", "pin")):
            beats = row.prefill < other.prefill and row.ttft_p99 < other.ttft_p99
            judged.append(
                (
                    row.label,
                    f"beats {other.label}",
                    beats,
                    f"{row.label} vs {other.label}: prefill {row.prefill:,} vs "
                    f"{other.prefill:,}, p99 TTFT {_s(row.ttft_p99)} vs {_s(other.ttft_p99)} s "
                    f"(target: fewer and lower: {_met(beats)})",
                )
            )
    return judged


def verdicts(results: Sequence[RunResult]) -> list[str]:
    """Issue 20's targets for each adaptive run (per client), each said met or not: within
    5% of the reference's prefill, >= 2x fewer than plain, p50 TTFT after a tool >= 2x
    lower than plain's, and fewer prefill tokens and a lower p99 TTFT than both the
    always-park and the pin-only run of the same client."""
    return [line for *_, line in _judged(results)]


def verdict_flags(results: Sequence[RunResult]) -> list[tuple[str, str, bool]]:
    """(adaptive run, target, met) for :func:`verdicts`' lines (the repeats count them)."""
    return [(label, target, ok) for label, target, ok, _ in _judged(results)]
