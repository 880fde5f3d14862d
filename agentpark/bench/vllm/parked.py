"""What the pool held at the end of an agentpark run of ``agentpark bench vllm``, from the
daemon's ``/v1/host`` before and after: the bytes parked (tier bytes in use), against one
copy per session (every parked session's KV counted whole: ``reclaimed_bytes``), and
sessions parked per GiB of pool either way. Sessions that share a prefix (the shared-prefix
workload) should hold it once: one copy per session over the bytes held is that factor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["GIB", "PoolFigures", "pool_figures"]

GIB = 2**30


def _tier_bytes(host: dict[str, Any]) -> int:
    return sum(int(t.get("used_bytes", 0)) for t in host.get("tiers", {}).values())


@dataclass(frozen=True)
class PoolFigures:
    sessions: int  # parked at the end of the run
    held_bytes: int  # the tiers' bytes in use, after less before
    one_copy_bytes: int  # every parked session's KV counted whole
    copied_bytes: int  # bytes copied into the pool during the run (counters.bytes_parked)

    @property
    def fewer(self) -> float:
        """How many times fewer bytes the pool holds than one copy per session would."""
        return self.one_copy_bytes / self.held_bytes if self.held_bytes else float("nan")

    def per_gib(self, nbytes: int) -> float:
        """Sessions parked per GiB of pool, were they to take ``nbytes``."""
        return self.sessions * GIB / nbytes if nbytes else float("nan")


def pool_figures(before: dict[str, Any], after: dict[str, Any]) -> PoolFigures | None:
    """The figures of a run with a daemon (None without: plain vLLM parks nothing)."""
    if not after:
        return None
    copied = int(after.get("counters", {}).get("bytes_parked", 0))
    copied -= int(before.get("counters", {}).get("bytes_parked", 0))
    return PoolFigures(
        sessions=int(after.get("sessions", {}).get("parked", 0)),
        held_bytes=_tier_bytes(after) - _tier_bytes(before),
        one_copy_bytes=int(after.get("reclaimed_bytes", 0)),
        copied_bytes=copied,
    )
