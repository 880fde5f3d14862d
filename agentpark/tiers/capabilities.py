"""What only some tiers (and the parts around them) can do, declared instead of probed.

The core asks ``isinstance(tier, Replaceable)`` rather than ``getattr(tier, "reopen",
None)``: a capability is a type a checker can follow, and a misspelt attribute is an
error, not a silently missing feature.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["Reattaching", "Replaceable", "WarmsUp"]


@runtime_checkable
class Reattaching(Protocol):
    """A persistent tier that reports what start-up found: its old bytes re-attached, or
    refused with the reason (file tiers, TPU Sync's shm segments)."""

    reattached: bool
    attach_problem: str | None


@runtime_checkable
class Replaceable(Protocol):
    """A tier in a file that can be removed, shrunk or replaced under the daemon."""

    gone: str | None  # why the file is no longer this tier's, once noticed

    def missing(self) -> str | None:
        """Why the file at the tier's path is not the one mapped (or unsafe), or None."""
        ...

    def reopen(self) -> None:
        """Make or map the tier's file again once no slot is in use."""
        ...


@runtime_checkable
class WarmsUp(Protocol):
    """A transfer that compiles its copy shapes before the daemon reports ready."""

    def warmup(self, engine: Any, tier: Any) -> None: ...
