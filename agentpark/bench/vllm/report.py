"""The tables and lines ``agentpark bench vllm`` prints: per run, prefill computed and its
ratio to plain, TTFT of the later turns, makespan, bytes moved, turns differing; each
agentpark run (one per turn-end rule and client) against plain; then what the pool held at
the end, and the turn-end rules side by side (agentpark.bench.vllm.variants)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from agentpark.bench.vllm.compare import breakdown, differs
from agentpark.bench.vllm.parked import pool_figures
from agentpark.bench.vllm.repeats import noise_table, target_counts
from agentpark.bench.vllm.results import RunResult
from agentpark.bench.vllm.spec import BLOCK_SIZE, VllmBenchSpec
from agentpark.bench.vllm.variants import variants_table, verdicts

__all__ = ["TARGETS", "print_noise", "print_report", "quantile", "ratios"]

# Fewer prefill tokens than plain that issue 19 asks of each client; the shared prefix's
# fewer bytes than one copy per session; a lower p50 TTFT.
TARGETS = {"agentpark": 2.0, "session-id": 2.0, "none": 1.6}
SHARED_PREFIX_TARGET = 4.0
TTFT_TARGET = 1.5


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def ratios(run: RunResult, plain: RunResult) -> tuple[float, float]:
    """(how many times fewer prefill tokens ``run`` computed than plain, how many times
    lower its p50 TTFT of the later turns); nan where either has nothing to divide."""
    nan = float("nan")
    prefill = plain.prefill_computed / run.prefill_computed if run.prefill_computed else nan
    ttfts, plain_ttfts = run.ttfts(), plain.ttfts()
    ttft = nan
    if ttfts and plain_ttfts and statistics.median(ttfts) > 0:
        ttft = statistics.median(plain_ttfts) / statistics.median(ttfts)
    return prefill, ttft


def _times(ratio: float) -> str:
    return "-" if math.isnan(ratio) else f"{ratio:.2f}x"


def _number(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def _runs_table(results: list[RunResult], spec: VllmBenchSpec, blocks: int) -> Any:
    from rich.table import Table

    by_name = {r.label: r for r in results}
    reference, plain = by_name.get("reference"), by_name.get("plain")
    table = Table(
        title=f"agentpark bench vllm: {spec.workload}, {spec.agents} "
        f"{'conversations' if spec.workload == 'multi-turn' else 'agents'} x {spec.turns} "
        f"turns, seed {spec.seed}, small KV {blocks} blocks of {BLOCK_SIZE}"
    )
    table.caption = (
        "vs plain: times fewer prefill tokens computed than plain. TTFT: turns after the "
        "first, from when "
        + (
            "a client took the conversation"
            if spec.workload == "multi-turn"
            else "the tool returned"
        )
    )
    table.add_column("run", no_wrap=True)
    for column in (
        "prefill computed",
        "vs plain",
        "TTFT p50 / p99 (s)",
        "makespan (s)",
        "parked / restored",
        "differing (tokens / logprobs)",
        "errors",
    ):
        table.add_column(column, justify="right")
    for run in results:
        ttfts = run.ttfts()
        counters = run.host.get("counters", {})
        moved = (
            (
                f"{counters.get('bytes_parked', 0) / 2**20:.0f} / "
                f"{counters.get('bytes_restored', 0) / 2**20:.0f} MiB"
            )
            if run.host
            else "-"
        )
        if reference is None or run is reference:
            differing = "(reference)" if run is reference else "-"
        else:
            differing = "{} / {}".format(*differs(run, reference))
        fewer = "-" if plain is None or run is plain else _times(ratios(run, plain)[0])
        table.add_row(
            run.label,
            f"{run.prefill_computed:,}",
            fewer,
            f"{statistics.median(ttfts):.3f} / {quantile(ttfts, 0.99):.3f}" if ttfts else "-",
            f"{run.makespan_s:.1f}",
            moved,
            differing,
            str(len(run.errors())),
        )
    return table


def _pool_table(results: list[RunResult], spec: VllmBenchSpec) -> Any:
    from rich.table import Table

    target = f" (target >= {SHARED_PREFIX_TARGET:g}x)" if spec.workload == "shared-prefix" else ""
    table = Table(title=f"the pool at the end: bytes parked against one copy per session{target}")
    table.add_column("run", no_wrap=True)
    for column in (
        "sessions parked",
        "bytes parked (MiB)",
        "one copy per session (MiB)",
        "fewer bytes",
        "sessions per GiB (one copy each)",
        "copied in (MiB)",
    ):
        table.add_column(column, justify="right")
    for run in results:
        figures = pool_figures(run.host_before, run.host)
        if figures is None:
            continue
        table.add_row(
            run.label,
            str(figures.sessions),
            f"{figures.held_bytes / 2**20:.1f}",
            f"{figures.one_copy_bytes / 2**20:.1f}",
            _times(figures.fewer),
            f"{_number(figures.per_gib(figures.held_bytes))} "
            f"({_number(figures.per_gib(figures.one_copy_bytes))})",
            f"{figures.copied_bytes / 2**20:.1f}",
        )
    return table if table.row_count else None


def print_report(results: list[RunResult], spec: VllmBenchSpec, blocks: int) -> None:
    from agentpark.bench.common import stdout_console

    out = stdout_console()
    out.print(_runs_table(results, spec, blocks))
    pool = _pool_table(results, spec)
    if pool is not None:
        out.print(pool)
    by_name = {r.label: r for r in results}
    reference, plain = by_name.get("reference"), by_name.get("plain")
    after = "after a tool" if spec.workload != "multi-turn" else "of the later turns"
    for run in results:
        if plain is None or not run.with_agentpark or not run.prefill_computed:
            continue
        prefill, ttft = ratios(run, plain)
        out.print(
            f"{run.label} vs plain: {prefill:.2f}x fewer prefill tokens "
            f"(target >= {TARGETS.get(run.client, 2.0):g}), {ttft:.2f}x lower p50 TTFT "
            f"{after} (target >= {TTFT_TARGET:g})"
        )
    if reference is not None:
        for run in results:
            if run is reference:
                continue
            parts = "; ".join(
                f"{kind} {n}: tokens {t}, logprobs {lp}"
                for kind, (t, lp, n) in breakdown(run, reference).items()
                if n
            )
            out.print(f"{run.label}, turns differing from the reference: {parts}")
    if sum(r.with_agentpark for r in results) > 1 or any(r.name == "adaptive" for r in results):
        out.print(variants_table(results, blocks))
        for line in verdicts(results):
            out.print(line)
    for run in results:
        if run.decisions:
            told = ", ".join(f"{label} {n}" for label, n in sorted(run.decisions.items()))
            out.print(f"{run.label}, turn ends: {told}")
    for run in results:
        for turn in run.errors()[:3]:
            out.print(f"{run.label}: agent {turn.agent} turn {turn.turn} failed: {turn.error}")


def print_noise(repeats: Sequence[Sequence[RunResult]]) -> None:
    """The repeats side by side, and how often each target was met, with the load."""
    import os

    from agentpark.bench.common import stdout_console

    out = stdout_console()
    out.print(noise_table(repeats))
    for line in target_counts(repeats):
        out.print(line)
    load = os.getloadavg()
    out.print(f"load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
