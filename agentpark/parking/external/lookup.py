"""What of a request's prefix the host tiers give an external engine: by content, or from
the session's own parked copy.

A request's blocks are keyed by vLLM's hash chain of its tokens (with its cache salt and
LoRA; agentpark.kvkeys) in its tenant's namespace, so any session's parked blocks with the
same content serve it, named or not, and never another tenant's or another salt's. A
session's own parked copy also serves it by token match (a copy parked before keys has
none). Whole blocks only, always leaving one token to compute.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from agentpark.blocks import PoolGeometry
from agentpark.enums import State
from agentpark.errors import AgentparkError
from agentpark.kvkeys import Lora
from agentpark.parking.core import SessionCore
from agentpark.parking.external.host import ExternalHost
from agentpark.parking.registry import LiveSession
from agentpark.tiers.base import HostTier

__all__ = ["NO_EXTRA", "Found", "Lookup", "RequestKeys"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequestKeys:
    """What keys a request's blocks besides its tokens: vLLM's extra keys."""

    cache_salt: str | None = None
    lora: Lora | None = None


NO_EXTRA = RequestKeys()
"""A request keyed by its tokens alone."""


@dataclass(frozen=True)
class Found:
    """Parked blocks ``0 .. len(slots)`` of a request's prefix in one tier."""

    tier: HostTier
    slots: list[int]
    digests: list[str | None]
    own: LiveSession | None  # the session's own parked copy serves them (else content)


class Lookup:
    """Prefix matches against the host tiers (no side effect but a promotion)."""

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
        session_id: str | None,
        tokens: Sequence[int] | np.ndarray,
        num_computed: int = 0,
        only_tier: str | None = None,
        extra: RequestKeys = NO_EXTRA,
    ) -> int:
        """Tokens beyond ``num_computed`` (which the engine has itself, whole blocks) that
        parked blocks can provide, in whole blocks; 0 for none.

        ``only_tier``: only blocks in that tier count (the one the engine loads from).
        """
        found = self.find(tenant, session_id, tokens, only_tier, extra)
        matched = len(found.slots) * self.geometry.block_size if found else 0
        return matched - num_computed if matched > num_computed else 0

    def find(
        self,
        tenant: str,
        session_id: str | None,
        tokens: Sequence[int] | np.ndarray,
        only_tier: str | None = None,
        extra: RequestKeys = NO_EXTRA,
        max_blocks: int | None = None,
    ) -> Found | None:
        """The longest run of parked blocks that starts ``tokens`` (leaving one to
        compute), up to ``max_blocks``: the session's own copy or any by content."""
        bs = self.geometry.block_size
        limit = (len(tokens) - 1) // bs if len(tokens) else 0
        if max_blocks is not None:
            limit = min(limit, max_blocks)
        if limit <= 0:
            return None
        best: Found | None = None
        live = self.core.registry.find((tenant, session_id)) if session_id else None
        if live is not None and live.row.state == State.PARKED and live.row.tier:
            tier = self.core.tiers.get(live.row.tier)
            n = min(limit, self._matched(live.tokens, tokens) // bs)
            if tier is not None and n and only_tier in (None, tier.name):
                digests = live.digests or [None] * len(live.slots)
                best = Found(tier, live.slots[:n], list(digests[:n]), live)
        keys = self._keys(tenant, tokens[: limit * bs], extra)
        for tier in self.core.mover.tiers.values():
            if only_tier not in (None, tier.name):
                continue
            slots = tier.find(keys)
            if slots and (best is None or len(slots) > len(best.slots)):
                best = Found(tier, slots, [tier.digest_of(s) for s in slots], None)
        return best

    def promote_and_lookup(
        self,
        tenant: str,
        session_id: str | None,
        tokens: Sequence[int] | np.ndarray,
        num_computed: int,
        tier: str,
        extra: RequestKeys = NO_EXTRA,
    ) -> int:
        """:meth:`lookup`, after moving the session's own copy parked in another tier
        (disk, where demotion put it) into ``tier``, the one the engine loads from, when
        that copy gives more than ``tier`` does.

        The move is the core's tier-to-tier copy (checksum verified, a ``move`` event),
        done before the answer, under the session's lock. It fails (``tier``'s answer
        stands) when ``tier`` has no room, the copy is damaged or the session is busy.
        """
        here = self.lookup(tenant, session_id, tokens, num_computed, tier, extra)
        live = self.core.registry.find((tenant, session_id)) if session_id else None
        if live is None or live.row.tier in (None, tier):
            return here
        if self.lookup(tenant, session_id, tokens, num_computed, None, extra) <= here:
            return here
        try:
            self.core.move(tenant, live.row.session_id, tier)
        except AgentparkError as exc:
            log.info(
                "session %s/%s: not promoted from %s into %s: %s",
                tenant,
                session_id,
                live.row.tier,
                tier,
                exc.message,
            )
            return here
        return self.lookup(tenant, session_id, tokens, num_computed, tier, extra)

    def _keys(
        self, tenant: str, tokens: Sequence[int] | np.ndarray, extra: RequestKeys
    ) -> list[Hashable]:
        chain = self.core.mover.hasher.chain(
            list(tokens), cache_salt=extra.cache_salt, lora=extra.lora
        )
        return [(tenant, k) for k in chain]

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
