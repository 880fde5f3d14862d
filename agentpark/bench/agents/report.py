"""The tables and verdict of ``agentpark bench agents``: the workload, each policy's
figures, what the daemon did, whether the parking policies' tokens equal keep-all's, and
the targets."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentpark.bench.agents.plot import plot_pool
from agentpark.bench.agents.results import PolicyResult
from agentpark.bench.agents.setup import Setup
from agentpark.bench.agents.timeline import undone_pressure_parks
from agentpark.bench.agents.workload import (
    ADAPTIVE,
    ALWAYS_PARK,
    KEEP_ALL,
    PARKING_POLICIES,
    RECOMPUTE,
)
from agentpark.bench.common import MiB

__all__ = ["print_workload", "report"]

# Targets (DESIGN.md section 10, issue 4): adaptive's makespan against the others'.
TARGET_VS_KEEP_ALL = 1.5  # at least this much faster
TARGET_VS_RECOMPUTE = 1.2  # at least this much faster
TARGET_VS_PARK_SLOWER = 0.05  # at most this much slower


def print_workload(out: Console, setup: Setup) -> None:
    spec, m, plans = setup.spec, setup.model, setup.plans
    finals = [p.final_tokens for p in plans]
    chains = [p.tool_time_s for p in plans]
    total_kv = sum(setup.final_blocks(p) for p in plans) * setup.block_bytes
    pool_bytes = setup.pool_blocks * setup.block_bytes
    weight = sum(t.weight for t in spec.tools) or 1.0
    tools = ", ".join(
        f"{t.name} {t.median_s * spec.time_scale:.3g}s median (sigma {t.sigma:g}, "
        f"{t.weight / weight:.0%}{', hinted' if t.hinted else ''})"
        for t in spec.tools
    )
    lines = [
        f"[bold]agents bench[/bold]: {spec.agents} agents x {spec.turns} turns "
        f"({spec.turns - 1} tool calls each), seed {spec.seed}, time scale {spec.time_scale:g}",
        f"model: d_model {m.d_model}, {m.n_layers} layers, {m.n_heads} heads "
        f"({m.n_kv_heads} KV) x {m.head_dim}, ffn {m.ffn_dim}, max_seq_len {m.max_seq_len}; "
        f"KV {_size(setup.token_bytes)} a token",
        f"per agent: prompt {spec.prompt_tokens[0]}-{spec.prompt_tokens[1]} tokens, tool results "
        f"{spec.result_tokens[0]}-{spec.result_tokens[1]}, {spec.new_tokens} new tokens a turn; "
        f"final contexts {min(finals)}-{max(finals)} tokens; tool time per agent "
        f"{min(chains):.1f}-{max(chains):.1f}s (mean {float(np.mean(chains)):.1f}s: no policy "
        f"finishes before the slowest agent's tools, {max(chains):.1f}s)",
        f"pool: {setup.pool_blocks} blocks of {setup.block_size} tokens "
        f"({_size(pool_bytes)}); the agents' KV at their final lengths is "
        f"{_size(total_kv)} = {total_kv / pool_bytes:.2f}x the pool",
        f"tools: {tools}",
    ]
    for line in lines:
        out.print(line, soft_wrap=True, highlight=False)


def _size(n: int) -> str:
    for unit, name in ((MiB, "MiB"), (1024, "KiB")):
        if n >= unit:
            return f"{n / unit:.1f} {name}"
    return f"{n} B"


def _fmt(value: float, spec: str) -> str:
    return "-" if math.isnan(value) else format(value, spec)


def _p99(values: Sequence[float]) -> float:
    return float(np.percentile(values, 99)) if values else math.nan


def _reference(results: Sequence[PolicyResult]) -> PolicyResult | None:
    """The run whose tokens the others are compared with: keep-all, else a parking one."""
    for name in (KEEP_ALL, *PARKING_POLICIES):
        for r in results:
            if r.policy == name and not r.problems():
                return r
    return None


def _differing_turns(result: PolicyResult, reference: PolicyResult) -> int:
    differ = 0
    for mine, theirs in zip(result.agents, reference.agents, strict=True):
        for a, b in zip(mine.outputs, theirs.outputs, strict=False):
            differ += a != b
    return differ


def report(out: Console, setup: Setup, results: Sequence[PolicyResult], plot: Path | None) -> int:
    by_policy = {r.policy: r for r in results}
    adaptive = by_policy.get(ADAPTIVE)
    base = adaptive.makespan_s if adaptive is not None and not adaptive.problems() else math.nan
    turns_total = setup.spec.agents * setup.spec.turns
    table = Table(title="agents bench: the same workload under four policies")
    for name in (
        "policy",
        "makespan s",
        "turns/s",
        "TTFT mean ms",
        "TTFT p99 ms",
        "peak agents in pool",
        "mean agents in pool",
        "HBM reclaimed MB·s",
        "makespan vs adaptive",
    ):
        table.add_column(
            name, justify="left" if name == "policy" else "right", no_wrap=name == "policy"
        )
    for r in results:
        ok = not r.problems()
        ttft = r.ttfts
        table.add_row(
            r.policy if ok else f"{r.policy} [red](failed)[/red]",
            _fmt(r.makespan_s, ".1f"),
            _fmt(r.turns / r.makespan_s if r.makespan_s > 0 else math.nan, ".2f"),
            _fmt(float(np.mean(ttft)) * 1e3 if ttft else math.nan, ".0f"),
            _fmt(_p99(ttft) * 1e3, ".0f"),
            str(r.peak_in_pool),
            _fmt(r.mean_in_pool, ".1f"),
            _fmt(r.reclaimed_byte_s / 1e6, ".1f"),
            _fmt(r.makespan_s / base if ok else math.nan, ".2f")
            + ("x" if ok and base == base else ""),
        )
    out.print(table)

    reference = _reference(results)
    problems: list[str] = []
    details = Table(title="what the daemon did (counts over the run; waits summed over agents)")
    for name in (
        "policy",
        "pauses parked/kept",
        "pressure parks (back <0.1s)",
        "idle parks",
        "restores (prefetch)",
        "re-prefills",
        "507 waits (s)",
        "admission wait s",
        "409 busy retries",
        "peak pool use",
        f"tokens = {reference.policy}" if reference is not None else "tokens",
    ):
        details.add_column(
            name, justify="left" if name == "policy" else "right", no_wrap=name == "policy"
        )
    for r in results:
        agents = r.agents
        same = "-"
        if reference is not None and r is not reference and agents and not r.problems():
            differ = _differing_turns(r, reference)
            same = "yes" if differ == 0 else f"no: {differ} of {turns_total} turns"
            if differ and r.policy in PARKING_POLICIES:
                problems.append(
                    f"{r.policy}: {differ} turns generated other tokens than under "
                    f"{reference.policy} (a restore must be bit-exact)"
                )
        elif r is reference:
            same = "(reference)"
        reprefills = sum(a.recreated + a.preempted for a in agents) + r.event_count("recompute")
        details.add_row(
            r.policy,
            f"{sum(a.parked for a in agents)} / {sum(a.kept for a in agents)}",
            f"{r.event_count('pause', ['pressure'])} ({undone_pressure_parks(r.events, 0.1)})",
            str(r.event_count("pause", ["idle"])),
            f"{r.event_count('resume')} ({r.event_count('resume', ['prefetch'])})",
            str(reprefills),
            f"{sum(a.full_waits for a in agents)} ({sum(a.full_wait_s for a in agents):.1f})",
            f"{sum(a.admission_wait_s for a in agents):.1f}",
            str(sum(a.busy_retries for a in agents)),
            f"{r.peak_pool_use:.0%}",
            same,
        )
    out.print(details)

    for r in results:
        problems.extend(f"{r.policy}: {p}" for p in r.problems())
    for line in _verdict(by_policy):
        out.print(line, soft_wrap=True, highlight=False)
    if plot is not None:
        out.print(plot_pool(results, plot, setup), soft_wrap=True, highlight=False)
    for p in problems[:50]:
        out.print(f"[red]FAIL[/red] {escape(p)}", soft_wrap=True, highlight=False)
    if len(problems) > 50:
        out.print(f"[red]FAIL[/red] ... and {len(problems) - 50} more", highlight=False)
    return 1 if problems else 0


def _verdict(by_policy: dict[str, PolicyResult]) -> list[str]:
    adaptive = by_policy.get(ADAPTIVE)
    if adaptive is None or adaptive.problems():
        return ["targets: not judged (no complete adaptive run)"]
    lines = []
    a = adaptive.makespan_s
    for other, target in ((KEEP_ALL, TARGET_VS_KEEP_ALL), (RECOMPUTE, TARGET_VS_RECOMPUTE)):
        r = by_policy.get(other)
        if r is None or r.problems():
            lines.append(f"target: adaptive >= {target:g}x faster than {other}: not judged")
            continue
        speedup = r.makespan_s / a
        met = "[green]met[/green]" if speedup >= target else "[red]NOT met[/red]"
        lines.append(f"target: adaptive >= {target:g}x faster than {other}: {speedup:.3f}x ({met})")
    park = by_policy.get(ALWAYS_PARK)
    if park is None or park.problems():
        lines.append("target: adaptive at most 5% slower than always-park: not judged")
    else:
        slower = a / park.makespan_s - 1
        met = "[green]met[/green]" if slower <= TARGET_VS_PARK_SLOWER else "[red]NOT met[/red]"
        how = f"{slower:.1%} slower" if slower > 0 else f"{-slower:.1%} faster"
        lines.append(
            f"target: adaptive at most {TARGET_VS_PARK_SLOWER:.0%} slower than always-park: "
            f"{how} ({met})"
        )
    return lines
