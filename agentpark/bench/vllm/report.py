"""The table and lines ``agentpark bench vllm`` prints: per run, prefill computed, TTFT
after a tool, makespan, bytes moved, turns differing; then agentpark against plain."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from agentpark.bench.vllm.compare import breakdown, differs
from agentpark.bench.vllm.results import RunResult
from agentpark.bench.vllm.spec import BLOCK_SIZE, VllmBenchSpec

__all__ = ["print_report", "quantile"]


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def print_report(results: list[RunResult], spec: VllmBenchSpec, blocks: int) -> None:
    from rich.table import Table

    from agentpark.bench.common import stdout_console

    by_name = {r.name: r for r in results}
    reference = by_name.get("reference")
    table = Table(
        title=f"agentpark bench vllm: {spec.agents} agents x {spec.turns} turns, "
        f"seed {spec.seed}, small KV {blocks} blocks of {BLOCK_SIZE}"
    )
    for column in (
        "run",
        "prefill computed",
        "TTFT after tool p50 / p99 (s)",
        "makespan (s)",
        "parked / restored",
        "turns differing (tokens / logprobs)",
        "errors",
    ):
        table.add_column(column, justify="right" if column != "run" else "left")
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
        table.add_row(
            run.name,
            f"{run.prefill_computed:,}",
            f"{statistics.median(ttfts):.3f} / {quantile(ttfts, 0.99):.3f}" if ttfts else "-",
            f"{run.makespan_s:.1f}",
            moved,
            differing,
            str(len(run.errors())),
        )
    out = stdout_console()
    out.print(table)
    plain, parked = by_name.get("plain"), by_name.get("agentpark")
    if plain and parked and parked.prefill_computed and parked.ttfts() and plain.ttfts():
        prefill = plain.prefill_computed / parked.prefill_computed
        ttft = statistics.median(plain.ttfts()) / statistics.median(parked.ttfts())
        out.print(
            f"agentpark vs plain: {prefill:.2f}x fewer prefill tokens (target >= 2), "
            f"{ttft:.2f}x lower p50 TTFT after a tool (target >= 1.5)"
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
            out.print(f"{run.name}, turns differing from the reference: {parts}")
    for run in results:
        if run.decisions:
            told = ", ".join(f"{label} {n}" for label, n in sorted(run.decisions.items()))
            out.print(f"{run.name}, turn ends: {told}")
    for run in results:
        for turn in run.errors()[:3]:
            out.print(f"{run.name}: agent {turn.agent} turn {turn.turn} failed: {turn.error}")
