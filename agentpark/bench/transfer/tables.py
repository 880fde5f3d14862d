"""The tables ``agentpark bench transfer`` prints: pause/restore against the reference, the
checksum's cost, the copy alone, and the A/Bs timed in the same repeats (fused vs hash
thread, in place vs XLA, native kernel vs numpy)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from rich.table import Table

from agentpark.bench.common import human, spread
from agentpark.bench.transfer.results import (
    DISK_TARGET_RATIO,
    MEMKIND_TARGET_RATIO,
    TARGET_FROM,
    TARGET_RATIO,
    SizeResult,
    other_copier,
)

__all__ = [
    "DMA_CLASS",
    "alone_ops",
    "checksum_table",
    "copiers_table",
    "copy_alone_table",
    "main_table",
    "paths_table",
    "reference_name",
    "restore_paths_table",
    "target_of",
]


def _ratio_cell(ratios: Sequence[float], target: float | None) -> str:
    ratio = statistics.median(ratios)
    style = "red" if target is not None and ratio < target else "green"
    return f"[{style}]{ratio:.2f}[/{style}] ({min(ratios):.2f}-{max(ratios):.2f})"


def main_table(
    tier: str, results: Sequence[SizeResult], threads: int = 1, backend: str = "host_copy"
) -> Table:
    disk = tier == "disk"
    memkind = backend == "jax_memkind"
    flags = f"--tier {tier}" + (f" --backend {backend}" if backend != "host_copy" else "")
    versus = reference_name(backend)
    title = f"agentpark bench transfer {flags}: SessionCore.pause/resume vs {versus}"
    table = Table(title=title + (" and a plain file write/read" if disk else ""))
    names = ["KV/session", "pause GB/s", "restore GB/s"]
    names += ["put d2h GB/s", "put h2d GB/s"] if memkind else ["copyto GB/s"]
    names += ["pause ratio", "restore ratio"]
    if threads > 1:
        names += [f"copyto x{threads} GB/s", f"pause/x{threads}", f"restore/x{threads}"]
    if disk:
        names += ["write GB/s", "read GB/s", "pause/write", "restore/read"]
    for name in names:
        table.add_column(name, justify="right")
    table.add_column("bit-exact", justify="center")
    for r in results:
        if not r.pause_s:
            table.add_row(human(r.size), *["-"] * (len(names) - 1), "[red]NO[/red]")
            continue
        judged = r.size >= TARGET_FROM
        cells = [human(r.size), spread(r.pause_gbps), spread(r.restore_gbps)]
        if memkind:
            cells += [spread(r.copy_before_pause_gbps), spread(r.copy_before_restore_gbps)]
        else:
            cells.append(spread(r.copy_before_pause_gbps + r.copy_before_restore_gbps))
        memcpy_target = r.target if judged and not disk else None
        cells.append(_ratio_cell(r.pause_ratios, memcpy_target))
        cells.append(_ratio_cell(r.restore_ratios, memcpy_target))
        if threads > 1:
            cells.append(spread(r._gbps(r.ncopy_before_pause_s + r.ncopy_before_restore_s)))
            cells += [_ratio_cell(r.pause_nratios, None), _ratio_cell(r.restore_nratios, None)]
        if disk:
            file_target = DISK_TARGET_RATIO if judged else None
            cells += [spread(r.file_write_gbps), spread(r.file_read_gbps)]
            cells.append(_ratio_cell(r.pause_file_ratios, file_target))
            cells.append(_ratio_cell(r.restore_file_ratios, file_target))
        cells.append("[green]yes[/green]" if r.exact else "[red]NO[/red]")
        table.add_row(*cells)
    return table


def checksum_table(results: Sequence[SizeResult], threads: int = 1) -> Table:
    tier = results[0].tier if results else "?"
    table = Table(
        title=f"what the checksum costs ({tier}): SessionCore.pause/resume with the tier "
        "checksummed (hashed as it copies), vs np.copyto"
    )
    names = ["KV/session", "pause GB/s", "restore GB/s", "pause ratio", "restore ratio"]
    if threads > 1:
        names += [f"pause/x{threads}", f"restore/x{threads}"]
    names += ["xxh3 alone GB/s", "+ on pause", "+ on restore"]
    for name in names:
        table.add_column(name, justify="right")
    for r in results:
        pause, resume = r.ops.get("pause+xxh3"), r.ops.get("restore+xxh3")
        if pause is None or resume is None or not r.checksum_s:
            table.add_row(human(r.size), *["-"] * (len(names) - 1))
            continue
        target = TARGET_RATIO if r.size >= TARGET_FROM and tier != "disk" else None
        cells = [human(r.size), spread(r._gbps(pause.s)), spread(r._gbps(resume.s))]
        cells += [_ratio_cell(pause.ratios, target), _ratio_cell(resume.ratios, target)]
        if threads > 1:
            cells += [_ratio_cell(pause.nratios, None), _ratio_cell(resume.nratios, None)]
        cells.append(spread(r.checksum_gbps))
        cells += [f"{r.checksum_pause_cost:+.0%}", f"{r.checksum_restore_cost:+.0%}"]
        table.add_row(*cells)
    return table


_ALONE = ("d2h", "h2d", "d2h+xxh3", "h2d+xxh3")
_ALONE_UNCHECKED = ("d2h", "h2d")  # tpu_sync and jax_memkind: checksum off only
DMA_CLASS = {
    "host_copy": "HostCopyTransfer",
    "jax_memkind": "JaxMemkindTransfer",
    "tpu_sync": "TpuSyncTransfer",
}


def alone_ops(backend: str) -> tuple[str, ...]:
    return _ALONE if backend == "host_copy" else _ALONE_UNCHECKED


def reference_name(backend: str) -> str:
    """The reference each ratio divides by, as the tables name it."""
    return "a plain pinned jax.device_put" if backend == "jax_memkind" else "np.copyto"


def target_of(backend: str) -> float:
    return MEMKIND_TARGET_RATIO if backend == "jax_memkind" else TARGET_RATIO


def _path(hash_thread: bool) -> str:
    return "hash thread" if hash_thread else "fused"


def copy_alone_table(
    results: Sequence[SizeResult],
    threads: int = 1,
    backend: str = "host_copy",
    hash_thread: bool = False,
) -> Table:
    tier = results[0].tier if results else "?"
    dma = DMA_CLASS[backend]
    table = Table(
        title=f"the copy alone ({tier}): {dma}.d2h/h2d, no SQLite, over {reference_name(backend)}"
    )
    alone = alone_ops(backend)
    heads = ["pause", "restore", "pause+xxh3", "restore+xxh3"][: len(alone)]
    if backend == "host_copy":
        here = _path(hash_thread)
        heads = [*heads[:2], f"pause+xxh3 ({here})", f"restore+xxh3 ({here})"]
    names = ["KV/session", *heads]
    if threads > 1:
        names += [f"{h}/x{threads}" for h in heads]
    for name in names:
        table.add_column(name, justify="right")
    for r in results:
        ops = [r.ops.get(name) for name in alone]
        if any(op is None or not op.s for op in ops):
            table.add_row(human(r.size), *["-"] * (len(names) - 1))
            continue
        target = r.target if r.size >= TARGET_FROM and tier != "disk" else None
        cells = [human(r.size), *(_ratio_cell(op.ratios, target) for op in ops if op)]
        if threads > 1:
            cells += [_ratio_cell(op.nratios, None) for op in ops if op]
        table.add_row(*cells)
    return table


def paths_table(results: Sequence[SizeResult], hash_thread: bool = False) -> Table:
    """The two checksum paths of the copy alone, timed in the same repeats."""
    tier = results[0].tier if results else "?"
    table = Table(
        title=f"checksum on, fused vs hash thread ({tier}): HostCopyTransfer.d2h/h2d alone, "
        "over np.copyto"
    )
    # Op names: the configured path is "d2h+xxh3", the other one "d2h+xxh3 alt".
    fused, threaded = ("alt", "") if hash_thread else ("", "alt")
    pairs = [(f"{d}+xxh3 {fused}".strip(), f"{d}+xxh3 {threaded}".strip()) for d in ("d2h", "h2d")]
    names = ["KV/session", "pause fused", "pause hash thread"]
    names += ["restore fused", "restore hash thread"]
    for name in names:
        table.add_column(name, justify="right")
    for r in results:
        ops = [r.ops.get(name) for pair in pairs for name in pair]
        if any(op is None or not op.s for op in ops):
            table.add_row(human(r.size), *["-"] * (len(names) - 1))
            continue
        target = TARGET_RATIO if r.size >= TARGET_FROM and tier != "disk" else None
        table.add_row(human(r.size), *(_ratio_cell(op.ratios, target) for op in ops if op))
    return table


def copiers_table(results: Sequence[SizeResult], native_copy: bool = True) -> Table:
    """The copy alone through the native kernel and through numpy, in the same repeats:
    a row per size and copy loop."""
    tier = results[0].tier if results else "?"
    table = Table(
        title=f"native kernel vs numpy ({tier}): HostCopyTransfer.d2h/h2d alone, over np.copyto"
    )
    other = other_copier(native_copy)
    ops = ("d2h", "h2d", "d2h+xxh3", "h2d+xxh3")
    names = {"kernel": ops, "numpy": tuple(f"{op} {other}" for op in ops)}
    if not native_copy:
        names = {"kernel": names["numpy"], "numpy": ops}
    heads = ["KV/session", "copy loop", "pause", "restore", "pause+xxh3", "restore+xxh3"]
    for head in heads:
        table.add_column(head, justify="right")
    for r in results:
        target = TARGET_RATIO if r.size >= TARGET_FROM and tier != "disk" else None
        for copier, op_names in names.items():
            cells = [r.ops.get(name) for name in op_names]
            if any(op is None or not op.s for op in cells):
                table.add_row(human(r.size), copier, *["-"] * len(op_names))
                continue
            ratios = (_ratio_cell(op.ratios, target) for op in cells if op)
            table.add_row(human(r.size), copier, *ratios)
    return table


def restore_paths_table(results: Sequence[SizeResult], threads: int = 1) -> Table:
    """The restore of the copy alone, in place and through XLA, timed in the same repeats."""
    tier = results[0].tier if results else "?"
    table = Table(
        title=f"restore, in place vs XLA ({tier}): HostCopyTransfer.h2d alone, over np.copyto"
    )
    pairs = [("h2d", "h2d xla"), ("h2d+xxh3", "h2d+xxh3 xla")]
    heads = ["restore in place", "restore XLA", "restore+xxh3 in place", "restore+xxh3 XLA"]
    names = ["KV/session", *heads]
    if threads > 1:
        names += [f"{h}/x{threads}" for h in heads]
    for name in names:
        table.add_column(name, justify="right")
    for r in results:
        ops = [r.ops.get(name) for pair in pairs for name in pair]
        if any(op is None or not op.s for op in ops):
            table.add_row(human(r.size), *["-"] * (len(names) - 1))
            continue
        target = TARGET_RATIO if r.size >= TARGET_FROM and tier != "disk" else None
        cells = [human(r.size), *(_ratio_cell(op.ratios, target) for op in ops if op)]
        if threads > 1:
            cells += [_ratio_cell(op.nratios, None) for op in ops if op]
        table.add_row(*cells)
    return table
