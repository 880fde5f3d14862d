"""The core's KV host for an engine that owns its pool (vLLM): what the core may ask of it.

Only what such an engine supports: its geometry, the pool as a copy endpoint when this
process can reach it (host arrays), letting blocks go (the engine frees its own), and the
pool's figures as far as the core knows them. It cannot hand the core blocks or recompute
(the session is restored into the engine's own blocks on its next turn), so it is no
:class:`~agentpark.parking.types.EngineHost`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from agentpark.blocks import PoolGeometry
from agentpark.enums import State
from agentpark.parking.mover import ArrayPool
from agentpark.parking.registry import LiveSession
from agentpark.snapshot import PoolFigures

__all__ = ["ExternalHost"]


class ExternalHost:
    """An external engine's pool, seen from the core."""

    backend_name = "external"

    def __init__(self, geometry: PoolGeometry, model_uid: str, pool: ArrayPool | None) -> None:
        self.geometry = geometry
        self.model_uid = model_uid
        self.engine_blocks = geometry.num_blocks  # the engine's pool size, as it reported
        self._pool = pool
        self.sessions: Callable[[], list[LiveSession]] = list  # set by external_core

    def endpoint(self) -> ArrayPool | None:
        return self._pool

    def release(self, live: LiveSession, blocks: Sequence[int]) -> None:
        """Nothing to do: the engine frees its own blocks once the call has returned."""

    def relayout(self, geometry: PoolGeometry, model_uid: str) -> None:
        """The engine registered another layout (or model)."""
        self.geometry = geometry
        self.model_uid = model_uid

    def pool_figures(self) -> PoolFigures:
        """The engine's pool as far as the core knows it: blocks of sessions it holds."""
        block = self.geometry.block_nbytes
        total = self.engine_blocks
        held = sum(
            len(live.block_table) for live in self.sessions() if live.row.state == State.ACTIVE
        )
        used = min(total, held)
        return PoolFigures(
            total_blocks=total,
            used_blocks=used,
            free_blocks=total - used,
            block_size_tokens=self.geometry.block_size,
            block_bytes=block,
            total_bytes=total * block,
            used_bytes=used * block,
            free_bytes=(total - used) * block,
        )
