"""The plot of ``agentpark bench agents``: sessions in the pool and parked KV over time
(a PNG, when matplotlib is installed; a note saying why not otherwise)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agentpark.bench.agents.results import PolicyResult
from agentpark.bench.agents.setup import Setup
from agentpark.bench.common import MiB

__all__ = ["plot_pool"]


def plot_pool(results: Sequence[PolicyResult], path: Path, setup: Setup) -> str:
    """Sessions holding KV in the pool, and parked KV, over time; a note without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return (
            f"plot: skipped ({path} not written): matplotlib is not installed "
            "(pip install 'agentpark[bench]')"
        )
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for r in results:
        if not r.timeline:
            continue
        xs = [t for t, _ in r.timeline] + [r.makespan_s]
        ys = [n for _, n in r.timeline] + [r.timeline[-1][1]]
        top.step(xs, ys, where="post", label=f"{r.policy} ({r.makespan_s:.1f}s)", linewidth=1.2)
        if r.samples:
            bottom.plot(
                [t - r.t0 for t, *_ in r.samples],
                [reclaimed / MiB for *_, reclaimed in r.samples],
                label=r.policy,
                linewidth=1.2,
            )
    spec = setup.spec
    top.set_ylabel("agents holding KV in the pool")
    top.set_title(
        f"{spec.agents} agents x {spec.turns} turns on a pool of {setup.pool_blocks} blocks "
        f"(agents' KV = {spec.pool_ratio:g}x the pool)"
    )
    top.legend(loc="upper right")
    top.grid(alpha=0.3)
    bottom.set_ylabel("parked KV, HBM reclaimed (MiB)")
    bottom.set_xlabel("seconds since the agents started")
    bottom.legend(loc="upper right")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot: {path}"
