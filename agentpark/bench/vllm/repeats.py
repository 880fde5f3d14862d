"""Several repeats of ``agentpark bench vllm`` on the same seeded workload: the noise.

One repeat is every run (reference, plain, the turn-end rules) on fresh servers; the
machine is shared, so one repeat's figures move with its load. This sets the repeats side
by side: per run, the median and the range (min-max) of prefill computed, of its ratio to
plain (taken within each repeat) and of the p50 / p99 TTFT after a tool, then how many
repeats met each of issue 20's targets (agentpark.bench.vllm.variants). ``save`` writes
every repeat's turns as JSON, for a reader who wants more than the table.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentpark.bench.vllm.results import RunResult
from agentpark.bench.vllm.spec import VllmBenchSpec
from agentpark.bench.vllm.variants import Variant, variants, verdict_flags

__all__ = ["noise_table", "save", "target_counts"]


def _spread(values: Sequence[float], show: Callable[[float], str]) -> str:
    """``median [min-max]``, or the one value; '-' when there is none."""
    kept = [v for v in values if not math.isnan(v)]
    if not kept:
        return "-"
    if len(kept) == 1:
        return show(kept[0])
    return f"{show(statistics.median(kept))} [{show(min(kept))}-{show(max(kept))}]"


def noise_table(repeats: Sequence[Sequence[RunResult]]) -> Any:
    """The rich table of every run's figures over the repeats."""
    from rich.table import Table

    rows: dict[str, list[Variant]] = {}
    for results in repeats:
        for row in variants(results):
            rows.setdefault(row.label, []).append(row)
    table = Table(title=f"over {len(repeats)} repeats: median [min-max]")
    table.add_column("run", no_wrap=True)
    for column in ("prefill computed", "vs plain", "TTFT p50 (s)", "TTFT p99 (s)"):
        table.add_column(column, justify="right")
    for label, seen in rows.items():
        table.add_row(
            label,
            _spread([float(r.prefill) for r in seen], lambda v: f"{v:,.0f}"),
            "-" if seen[0].name == "plain" else _spread([r.vs_plain for r in seen], _times),
            _spread([r.ttft_p50 for r in seen], _seconds),
            _spread([r.ttft_p99 for r in seen], _seconds),
        )
    return table


def target_counts(repeats: Sequence[Sequence[RunResult]]) -> list[str]:
    """One line per adaptive run and target: in how many repeats it was met."""
    met: dict[tuple[str, str], int] = {}
    for results in repeats:
        for label, target, ok in verdict_flags(results):
            met[(label, target)] = met.get((label, target), 0) + int(ok)
    n = len(repeats)
    return [f"{label}: {target}: met in {k} of {n} repeats" for (label, target), k in met.items()]


def save(
    path: Path, spec: VllmBenchSpec, blocks: int, repeats: Sequence[Sequence[RunResult]]
) -> None:
    """Every repeat's runs, turn by turn, as JSON (``path`` is overwritten)."""
    body = {
        "spec": dataclasses.asdict(spec),
        "blocks": blocks,
        "repeats": [[dataclasses.asdict(run) for run in results] for results in repeats],
    }
    path.write_text(json.dumps(body, indent=1, default=str) + "\n")


def _times(value: float) -> str:
    return f"{value:.2f}x"


def _seconds(value: float) -> str:
    return f"{value:.3f}"
