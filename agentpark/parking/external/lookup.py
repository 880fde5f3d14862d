"""What of a request's prefix a session's parked copy can give an external engine."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from agentpark.blocks import PoolGeometry
from agentpark.enums import State
from agentpark.errors import AgentparkError
from agentpark.parking.core import SessionCore
from agentpark.parking.external.host import ExternalHost

__all__ = ["Lookup"]

log = logging.getLogger(__name__)


class Lookup:
    """Prefix matches against parked copies (no side effect but a promotion)."""

    def __init__(self, core: SessionCore, host: ExternalHost) -> None:
        self.core = core
        self.host = host

    @property
    def geometry(self) -> PoolGeometry:
        return self.host.geometry

    @property
    def model_uid(self) -> str:
        return self.host.model_uid

    def lookup(
        self,
        tenant: str,
        session_id: str,
        tokens: Sequence[int] | np.ndarray,
        num_computed: int = 0,
        only_tier: str | None = None,
    ) -> int:
        """Tokens beyond ``num_computed`` (which the engine has itself, whole blocks) that
        the session's parked copy can provide, in whole blocks; 0 for none.

        ``only_tier``: only a copy in that tier counts (the one the engine loads from).
        """
        live = self.core.registry.find((tenant, session_id))
        if live is None or live.row.state != State.PARKED:
            return 0
        if only_tier is not None and live.row.tier != only_tier:
            return 0
        matched = self._matched(live.tokens, tokens)
        return matched - num_computed if matched > num_computed else 0

    def promote_and_lookup(
        self,
        tenant: str,
        session_id: str,
        tokens: Sequence[int] | np.ndarray,
        num_computed: int,
        tier: str,
    ) -> int:
        """:meth:`lookup`, after moving a usable copy parked in another tier (disk, where
        demotion put it) into ``tier``, the one the engine loads from.

        The move is the core's tier-to-tier copy (checksum verified, a ``move`` event),
        done before the answer, under the session's lock. It fails (0 tokens, the engine
        computes) when ``tier`` has no room, the copy is damaged or the session is busy.
        """
        if self.lookup(tenant, session_id, tokens, num_computed) == 0:
            return 0
        live = self.core.registry.find((tenant, session_id))
        if live is not None and live.row.tier not in (None, tier):
            try:
                self.core.move(tenant, session_id, tier)
            except AgentparkError as exc:
                log.info(
                    "session %s/%s: not promoted from %s into %s: %s",
                    tenant,
                    session_id,
                    live.row.tier,
                    tier,
                    exc.message,
                )
                return 0
        return self.lookup(tenant, session_id, tokens, num_computed, only_tier=tier)

    def _matched(self, parked: Sequence[int], tokens: Sequence[int] | np.ndarray) -> int:
        """Whole-block common prefix of ``parked`` and ``tokens``, leaving one to compute."""
        limit = min(len(parked), len(tokens) - 1)
        common = 0
        if limit > 0:
            a = np.asarray(parked[:limit])
            b = np.asarray(tokens[:limit])
            differs = np.flatnonzero(a != b)
            common = int(differs[0]) if differs.size else limit
        return common // self.geometry.block_size * self.geometry.block_size
