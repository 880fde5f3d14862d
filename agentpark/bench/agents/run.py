"""``run_agents_bench``: the same seeded workload under every policy, each on a fresh
daemon, then the tables and verdict (agentpark.bench.agents's docstring says what)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from agentpark.bench.agents.policy_run import run_policy
from agentpark.bench.agents.report import print_workload, report
from agentpark.bench.agents.results import PolicyResult
from agentpark.bench.agents.setup import BENCH_MODEL, make_setup, prewarm
from agentpark.bench.agents.workload import POLICIES, WorkloadSpec
from agentpark.bench.common import progress_bar, stdout_console
from agentpark.config import ModelSettings

__all__ = ["SHM_ROOT", "run_agents_bench"]

SHM_ROOT = Path("/dev/shm")


def run_agents_bench(
    spec: WorkloadSpec | None = None,
    *,
    policies: Sequence[str] = POLICIES,
    model: ModelSettings | None = None,
    block_size: int = 16,
    plot: Path | None = None,
    console: Console | None = None,
    progress_console: Console | None = None,
    timeout_s: float = 1800.0,
    sample_s: float = 0.05,
) -> int:
    """Run every policy on the same workload and print the tables (stdout by default).

    Returns 0 when every run completed and checked out, 1 otherwise, 2 for arguments that
    cannot run. ``plot``: a PNG of sessions in the pool over time, when matplotlib is there.
    The progress bar goes to ``progress_console`` (stderr by default).
    """
    spec = spec if spec is not None else WorkloadSpec()
    out = console if console is not None else stdout_console(170)
    err = progress_console if progress_console is not None else Console(stderr=True)
    problem = spec.problem()
    unknown = [p for p in policies if p not in POLICIES]
    if problem is None and (unknown or not policies or len(set(policies)) != len(policies)):
        problem = f"policies must be distinct names of {', '.join(POLICIES)}; got {policies}"
    if problem is not None:
        err.print(f"agentpark: {escape(problem)}", soft_wrap=True, highlight=False)
        return 2
    results: list[PolicyResult] = []
    with contextlib.ExitStack() as cleanup:
        root = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="agentpark-")))
        parent = SHM_ROOT if SHM_ROOT.is_dir() else root
        shm_root = Path(tempfile.mkdtemp(prefix="agentpark-bench-agents-", dir=parent))
        cleanup.callback(shutil.rmtree, shm_root, ignore_errors=True)
        setup = make_setup(
            spec, model or BENCH_MODEL, block_size, root, shm_root, timeout_s, sample_s
        )
        print_workload(out, setup)
        with progress_bar(err) as progress:
            task = progress.add_task(
                "compiling the model", total=len(policies) * spec.agents * spec.turns
            )
            prewarm(setup)
            for policy in policies:
                progress.update(task, description=f"agents bench: {policy}")
                try:
                    result = run_policy(policy, setup, lambda: progress.advance(task))
                except Exception as exc:  # the daemon did not start, ...
                    result = PolicyResult(
                        policy, [], setup.plans, error=f"{type(exc).__name__}: {exc}"
                    )
                results.append(result)
    return report(out, setup, results, plot)
