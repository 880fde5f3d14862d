"""What ``agentpark bench transfer`` measures per size (times per repeat, and the ratios and
targets computed from them)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentpark.bench.common import MiB

__all__ = [
    "DISK_TARGET_RATIO",
    "MEMKIND_TARGET_RATIO",
    "TARGET_FROM",
    "TARGET_RATIO",
    "Op",
    "SizeResult",
    "other_copier",
]

TARGET_RATIO = 0.95
"""dram and shm: pause and restore (checksum off and on) should reach this fraction of a
single-thread np.copyto from TARGET_FROM."""
MEMKIND_TARGET_RATIO = 0.9
"""jax_memkind: pause and restore should reach this fraction of a plain pinned device_put of
the same bytes (d2h for the pause, h2d for the restore) from TARGET_FROM."""
DISK_TARGET_RATIO = 0.8
"""disk: pause and restore should reach this fraction of a plain file write / read."""
TARGET_FROM = 256 * MiB


@dataclass
class SizeResult:
    """What one size measured; times in seconds, one entry per repeat."""

    size: int
    tier: str = "dram"
    pause_s: list[float] = field(default_factory=list)
    restore_s: list[float] = field(default_factory=list)
    # The reference just before each pause and restore: np.copyto; for jax_memkind a plain
    # device_put device -> pinned_host (pause) and pinned_host -> device (restore).
    copy_before_pause_s: list[float] = field(default_factory=list)
    copy_before_restore_s: list[float] = field(default_factory=list)
    checksum_s: list[float] = field(default_factory=list)  # xxh3 over the parked copy
    file_write_s: list[float] = field(default_factory=list)  # disk: pwrite + fsync
    file_read_s: list[float] = field(default_factory=list)  # disk: preadv
    mismatch: str | None = None  # why the restored bytes differ; None when bit-exact
    copy_threads: int = 1
    # np.copyto over copy_threads threads, just before the checksum-off pause and restore.
    ncopy_before_pause_s: list[float] = field(default_factory=list)
    ncopy_before_restore_s: list[float] = field(default_factory=list)
    # "pause+xxh3", "restore+xxh3" (SessionCore, tier checksummed); "d2h", "h2d",
    # "d2h+xxh3", "h2d+xxh3" (the copy alone).
    ops: dict[str, Op] = field(default_factory=dict)
    backend: str = "host_copy"

    @property
    def exact(self) -> bool:
        return self.mismatch is None

    @property
    def target(self) -> float:
        """The ratio dram and shm should reach (to the reference of this backend)."""
        return MEMKIND_TARGET_RATIO if self.backend == "jax_memkind" else TARGET_RATIO

    def _gbps(self, seconds: Sequence[float]) -> list[float]:
        return [self.size / s / 1e9 for s in seconds]

    @property
    def pause_gbps(self) -> list[float]:
        return self._gbps(self.pause_s)

    @property
    def restore_gbps(self) -> list[float]:
        return self._gbps(self.restore_s)

    @property
    def copy_before_pause_gbps(self) -> list[float]:
        return self._gbps(self.copy_before_pause_s)

    @property
    def copy_before_restore_gbps(self) -> list[float]:
        return self._gbps(self.copy_before_restore_s)

    @property
    def checksum_gbps(self) -> list[float]:
        return self._gbps(self.checksum_s)

    @property
    def file_write_gbps(self) -> list[float]:
        return self._gbps(self.file_write_s)

    @property
    def file_read_gbps(self) -> list[float]:
        return self._gbps(self.file_read_s)

    @property
    def pause_ratios(self) -> list[float]:
        """Per repeat: pause GB/s over the np.copyto run just before it."""
        return _ratios(self.pause_gbps, self.copy_before_pause_gbps)

    @property
    def restore_ratios(self) -> list[float]:
        """Per repeat: restore GB/s over the np.copyto run just before it."""
        return _ratios(self.restore_gbps, self.copy_before_restore_gbps)

    @property
    def pause_file_ratios(self) -> list[float]:
        """Per repeat (disk): pause GB/s over the plain file write + fsync just before it."""
        return _ratios(self.pause_gbps, self.file_write_gbps)

    @property
    def restore_file_ratios(self) -> list[float]:
        """Per repeat (disk): restore GB/s over the plain file read just before it."""
        return _ratios(self.restore_gbps, self.file_read_gbps)

    @property
    def pause_nratios(self) -> list[float]:
        """Per repeat: pause GB/s over the copy_threads-thread np.copyto just before it."""
        return _ratios(self.pause_gbps, self._gbps(self.ncopy_before_pause_s))

    @property
    def restore_nratios(self) -> list[float]:
        return _ratios(self.restore_gbps, self._gbps(self.ncopy_before_restore_s))

    def op(self, name: str) -> Op:
        return self.ops.setdefault(name, Op())

    @property
    def checksum_pause_cost(self) -> float:
        """What the checksum adds to a pause: median pause time, checksum on over off."""
        return statistics.median(self.op("pause+xxh3").s) / statistics.median(self.pause_s) - 1

    @property
    def checksum_restore_cost(self) -> float:
        """What verifying adds to a restore: median restore time, checksum on over off."""
        on = statistics.median(self.op("restore+xxh3").s)
        return on / statistics.median(self.restore_s) - 1

    def judged(self) -> list[tuple[str, list[float], float]]:
        """``(name, per-repeat ratios, target)`` for the targets of this tier."""
        if self.tier == "disk":
            return [
                ("pause/file write", self.pause_file_ratios, DISK_TARGET_RATIO),
                ("restore/file read", self.restore_file_ratios, DISK_TARGET_RATIO),
            ]
        judged = [
            ("pause", self.pause_ratios, self.target),
            ("restore", self.restore_ratios, self.target),
        ]
        for name in ("pause+xxh3", "restore+xxh3"):
            if name in self.ops:
                judged.append((name, self.ops[name].ratios, self.target))
        return judged


@dataclass
class Op:
    """One timed operation per repeat, each with the references timed just before it."""

    s: list[float] = field(default_factory=list)
    ref1: list[float] = field(default_factory=list)  # np.copyto, one thread (or PinnedPut)
    refn: list[float] = field(default_factory=list)  # np.copyto over copy_threads threads

    @property
    def ratios(self) -> list[float]:
        """Per repeat: GB/s over the single-thread np.copyto's (= its time over ours)."""
        return [r / t for r, t in zip(self.ref1, self.s, strict=True)]

    @property
    def nratios(self) -> list[float]:
        return [r / t for r, t in zip(self.refn, self.s, strict=True)]


def _ratios(values: Sequence[float], references: Sequence[float]) -> list[float]:
    return [v / r for v, r in zip(values, references, strict=True)]


def other_copier(native_copy: bool) -> str:
    """The copy loop the A/B times beside the configured one (op-name suffix)."""
    return "numpy" if native_copy else "kernel"
