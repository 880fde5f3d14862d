"""``run_transfer_bench``: check the arguments, build the parts, measure every size, print
the tables, notes and verdicts (agentpark.bench.transfer's docstring says what)."""

from __future__ import annotations

import contextlib
import gc
import shutil
import tempfile
from pathlib import Path

from rich.console import Console

from agentpark.bench.common import human, progress_bar, stdout_console
from agentpark.bench.transfer.arguments import default_parent, problem
from agentpark.bench.transfer.daemon_parts import Stack
from agentpark.bench.transfer.geometry import block_tokens as block_tokens_of
from agentpark.bench.transfer.measure import bench_size
from agentpark.bench.transfer.notes import notes as notes_of
from agentpark.bench.transfer.references import threaded_copyto
from agentpark.bench.transfer.results import SizeResult
from agentpark.bench.transfer.tables import (
    checksum_table,
    copiers_table,
    copy_alone_table,
    main_table,
    paths_table,
    restore_paths_table,
)
from agentpark.bench.transfer.verdicts import copy_alone_verdict, verdict
from agentpark.dma import native

__all__ = ["SEED", "run_transfer_bench"]

SEED = 20240611


def run_transfer_bench(
    sizes: list[int],
    repeats: int,
    *,
    tier: str = "dram",
    directory: Path | None = None,
    console: Console | None = None,
    progress_console: Console | None = None,
    copy_threads: int = 1,
    backend: str = "host_copy",
    hash_thread: bool = False,
    native_copy: bool = True,
) -> int:
    """Measure, print the tables (to ``console``, stdout by default); 1 if a restore differs.

    ``tier`` is ``dram``, ``shm`` or ``disk``. The shm and disk tier files go in a temporary
    directory made under ``directory`` (default /dev/shm for shm, the current directory for
    disk) and removed at the end, also on error; a disk directory on a memory filesystem
    (tmpfs) is refused. The progress bar goes to ``progress_console`` (stderr by default).
    Returns 2 for arguments that cannot be measured: sizes that are not a whole number of KV
    tokens, ``repeats < 1``, an unknown tier, a directory that cannot hold the files, or
    ``copy_threads`` outside 1..64, an unknown ``backend``, or ``backend="tpu_sync"`` or
    ``"jax_memkind"`` with another tier than dram, ``copy_threads`` > 1 or ``hash_thread``, or
    ``"jax_memkind"`` on a JAX whose device lacks the ``device`` or ``pinned_host`` memory kind.
    """
    out = console if console is not None else stdout_console(200 if tier == "disk" else 150)
    err = progress_console if progress_console is not None else Console(stderr=True)
    why = problem(sizes, repeats, tier, directory, copy_threads, backend, hash_thread)
    if why is not None:
        err.print(f"agentpark: {why}", soft_wrap=True, highlight=False)
        return 2
    parent = directory if directory is not None else default_parent(tier)
    results: list[SizeResult] = []
    block_tokens = block_tokens_of(sizes)
    with contextlib.ExitStack() as cleanup:
        state_dir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="agentpark-")))
        tier_dir: Path | None = None
        if parent is not None:
            tier_dir = Path(tempfile.mkdtemp(prefix="agentpark-bench-", dir=parent))
            # Registered first, so it runs last: after the tier's file is closed.
            cleanup.callback(shutil.rmtree, tier_dir, ignore_errors=True)
        stack = Stack.build(
            state_dir,
            tier,
            tier_dir,
            max(sizes),
            block_tokens,
            copy_threads,
            backend,
            hash_thread,
            native_copy,
        )
        cleanup.callback(stack.close)
        ncopy = threaded_copyto(copy_threads, cleanup)
        with progress_bar(err) as progress:
            # Per repeat: pause, restore, (checksum on,) copy alone.
            per_repeat = 4 if stack.checksummed else 3
            label = tier if backend == "host_copy" else f"{tier}, {backend}"
            task = progress.add_task(
                f"transfer bench ({label})", total=len(sizes) * (2 + per_repeat * repeats)
            )
            for i, size in enumerate(sizes):

                def step(what: str, size: int = size) -> None:
                    progress.update(task, advance=1, description=f"{tier} {human(size)}: {what}")

                results.append(bench_size(stack, size, repeats, SEED + i, step, tier_dir, ncopy))
                gc.collect()
        notes = notes_of(stack, tier, tier_dir, repeats)
    out.print(main_table(tier, results, copy_threads, backend))
    if backend == "host_copy":  # the others: checksum off only (see agentpark.bench.transfer)
        out.print(checksum_table(results, copy_threads))
    out.print(copy_alone_table(results, copy_threads, backend, hash_thread))
    if backend == "host_copy":
        out.print(paths_table(results, hash_thread))
        out.print(restore_paths_table(results, copy_threads))
        if native.available() is not None:
            out.print(copiers_table(results, stack.native_copy))
    for note in notes:
        out.print(note, soft_wrap=True, highlight=False)
    failed = [r for r in results if not r.exact]
    for r in failed:
        out.print(
            f"[red]FAIL[/red] {tier} {human(r.size)}: restored KV is not bit-exact: {r.mismatch}"
        )
    out.print(verdict(tier, results, backend), soft_wrap=True, highlight=False)
    if tier != "disk":
        out.print(copy_alone_verdict(results, backend), soft_wrap=True, highlight=False)
    return 1 if failed else 0
