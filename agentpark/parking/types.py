"""The session core's contracts: what it needs from an engine driver, and what it returns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agentpark.blocks import PoolGeometry
from agentpark.enums import Decision, Reason, RestoredFrom, Tier, TierChoice
from agentpark.errors import (
    PoolFullError,
    StorageUnavailableError,
    TransferError,
)
from agentpark.kvkeys import DEFAULT_SEED, HashAlgo
from agentpark.parking.mover import Endpoint
from agentpark.parking.registry import LiveSession
from agentpark.snapshot import PoolFigures
from agentpark.store.models import SessionRow

__all__ = [
    "Advisor",
    "CoreOptions",
    "EngineHost",
    "KVHost",
    "MoveResult",
    "PauseAdvice",
    "PauseOrder",
    "PauseResult",
    "ResumeResult",
    "as_transfer_error",
]


class KVHost(Protocol):
    """What the core needs from whoever runs the model: an engine driver."""

    geometry: PoolGeometry
    model_uid: str
    backend_name: str  # the DMA backend that moves its bytes, for /v1/host

    def endpoint(self) -> Endpoint | None:
        """The pool as the mover's copy source and destination (None: the engine copies)."""
        ...

    def release(self, live: LiveSession, blocks: Sequence[int]) -> None:
        """The blocks go back to the engine (after a park, a delete, a failed restore)."""
        ...

    def pool_figures(self) -> PoolFigures: ...


@runtime_checkable
class EngineHost(KVHost, Protocol):
    """An engine whose blocks the core allocates and fills itself (one in this process):
    REST resume, the event loop's fast paths and recompute need these. An external engine
    (vLLM) restores a session into its own blocks on its next turn, so it has none."""

    def claim(self, live: LiveSession, n: int) -> list[int]:
        """``n`` pool blocks for a restore of ``live`` (PoolFullError when there are none)."""
        ...

    def claim_now(self, live: LiveSession, n: int) -> list[int] | None:
        """``n`` pool blocks if they are free and nobody waits for blocks; else None."""
        ...

    def engine_lock_now(self) -> AbstractContextManager[bool]:
        """Holds the engine (the lock its steps and the mover's copies take) if nobody
        else does; yields whether it got it. The non-waiting fast paths start here."""
        ...

    def recompute(self, live: LiveSession, blocks: Sequence[int]) -> None:
        """Rebuild the KV of ``live.tokens`` into ``blocks`` (and ``live.next_logits``)."""
        ...

    def wake(self) -> None:
        """Wake every request waiting for blocks (drain: they give up with 503)."""
        ...


@dataclass(frozen=True)
class CoreOptions:
    checksum_tiers: frozenset[str] = frozenset({Tier.SHM, Tier.DISK})
    background_workers: int = 4
    # The longest a user operation waits for the daemon's own work on its session.
    background_yield_s: float = 30.0
    # The longest a generate or resume waits in the queue for pool blocks before 507.
    admission_timeout_s: float = 30.0
    # Block keys: vLLM's block-hash chain (agentpark.kvkeys), as vLLM is configured.
    key_algo: HashAlgo = "sha256"
    key_seed: str = DEFAULT_SEED
    # Requests that name no session (agentpark.parking.external.anonymous).
    anonymous_share: float = 0.25
    anonymous_ttl_s: float = 600.0


@dataclass(frozen=True)
class PauseOrder:
    """A pause as a caller asks for it."""

    tier: str = TierChoice.AUTO
    tool: str | None = None
    expected_resume_s: float | None = None
    force: bool = False  # park even when the advisor would keep it
    reason: str = Reason.EXPLICIT


@dataclass(frozen=True)
class PauseAdvice:
    """The advisor's answer: park or keep, why, and the pause length it assumed."""

    park: bool
    why: str
    expected_s: float | None


Advisor = Callable[[int, str | None, float | None], PauseAdvice]
"""(kv_bytes, tool, expected_resume_s given) -> advice; the policy service is one."""


@dataclass(frozen=True)
class PauseResult:
    row: SessionRow
    decision: Decision
    why: str
    expected_s: float | None
    pause_ms: float | None  # None: still in flight (wait=False)


@dataclass(frozen=True)
class ResumeResult:
    row: SessionRow
    restored_from: RestoredFrom
    resume_ms: float | None  # None: still in flight (wait=False)


@dataclass(frozen=True)
class MoveResult:
    row: SessionRow
    from_tier: str
    move_ms: float


def as_transfer_error(what: str, exc: Exception) -> Exception:
    if isinstance(exc, TransferError | PoolFullError | StorageUnavailableError):
        return exc
    return TransferError(f"{what} failed: {exc}", operation=what)
