"""The verdict lines of ``agentpark bench transfer``: each judged ratio's median against its
target, from TARGET_FROM up (printed; they do not change the exit status)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from agentpark.bench.common import human
from agentpark.bench.transfer.results import DISK_TARGET_RATIO, TARGET_FROM, SizeResult
from agentpark.bench.transfer.tables import alone_ops, target_of

__all__ = ["copy_alone_verdict", "verdict"]


def copy_alone_verdict(results: Sequence[SizeResult], backend: str = "host_copy") -> str:
    checked = "checksum off and on" if backend == "host_copy" else "checksum off"
    target = target_of(backend)
    head = (
        f"the copy alone: ratio >= {target} {_of_reference(backend)}from {human(TARGET_FROM)} "
        f"up, {checked}: "
    )
    judged = [r for r in results if r.size >= TARGET_FROM and r.ops.get("d2h")]
    if not judged:
        return head + "no size to judge"
    misses = [
        f"{name} at {human(r.size)} ({statistics.median(r.ops[name].ratios):.2f})"
        for r in judged
        for name in alone_ops(backend)
        if statistics.median(r.ops[name].ratios) < target
    ]
    return head + ("met" if not misses else "MISSED: " + ", ".join(misses))


def _of_reference(backend: str) -> str:
    """What a verdict's ratio is to, when it is not single-thread np.copyto ('' then)."""
    if backend != "jax_memkind":
        return ""
    return "of a plain pinned jax.device_put of the same bytes (d2h: pause, h2d: restore) "


def verdict(tier: str, results: Sequence[SizeResult], backend: str = "host_copy") -> str:
    if tier == "disk":
        head = (
            f"target: pause/restore >= {DISK_TARGET_RATIO} of the plain file write/read from "
            f"{human(TARGET_FROM)} up: "
        )
    else:
        checked = "checksum off and on" if backend == "host_copy" else "checksum off"
        head = (
            f"target: ratio >= {target_of(backend)} {_of_reference(backend)}from "
            f"{human(TARGET_FROM)} up, both directions, {checked}: "
        )
    judged = [r for r in results if r.size >= TARGET_FROM and r.pause_s]
    if not judged:
        return head + "no size to judge"
    misses = [
        f"{name} at {human(r.size)} ({statistics.median(ratios):.2f})"
        for r in judged
        for name, ratios, target in r.judged()
        if statistics.median(ratios) < target
    ]
    return head + ("met" if not misses else "MISSED: " + ", ".join(misses))
