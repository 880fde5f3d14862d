"""Conversations with no session name: parked by their prefix, within a share, for a while.

A request that names no session (no agentpark params, no vLLM ``session_id``) still ends a
turn whose KV a later request with the same prefix can use: it is parked as an anonymous
session (``anon-<random>``, ``meta.anonymous``), found again by content only
(agentpark.parking.external.lookup), never by name. So the pool cannot fill with them:

- a conversation's next turn supersedes its previous one (the older session, whose blocks
  are a prefix of the new chain, is deleted once the new one is parked: its blocks live
  on in the new one);
- all anonymous copies together hold at most ``share`` of a tier's slots (the oldest go
  first to make room);
- each is dropped ``ttl_s`` after its turn ended.

What an anonymous session cannot have: learned tool pauses (no tool is named), a pause
hint, a restore of a prefix it shares with nobody, or a GET by name (it has none the
client knows; /v1/requests/{id} tells what happened by request id).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from agentpark.enums import State
from agentpark.errors import AgentparkError
from agentpark.parking.core import SessionCore
from agentpark.parking.registry import LiveSession
from agentpark.tiers.base import HostTier

__all__ = ["ANONYMOUS_PREFIX", "Anonymous", "AnonymousPolicy", "is_anonymous"]

log = logging.getLogger(__name__)

ANONYMOUS_PREFIX = "anon-"


def is_anonymous(live: LiveSession) -> bool:
    return bool((live.row.meta or {}).get("anonymous"))


@dataclass(frozen=True)
class AnonymousPolicy:
    """How much of the pool unnamed conversations may hold, and for how long."""

    share: float = 0.25  # of a tier's slots
    ttl_s: float = 600.0


class Anonymous:
    """The anonymous sessions of one core: naming, superseding, room and expiry."""

    def __init__(self, core: SessionCore, policy: AnonymousPolicy) -> None:
        self.core = core
        self.policy = policy

    @staticmethod
    def new_id() -> str:
        return f"{ANONYMOUS_PREFIX}{uuid.uuid4().hex[:24]}"

    def sessions(self, tenant: str | None = None) -> list[LiveSession]:
        return [
            live
            for live in self.core.registry.all()
            if is_anonymous(live) and tenant in (None, live.row.tenant)
        ]

    def superseded(self, tenant: str, keys: Sequence[Hashable | None], keep: str) -> list[str]:
        """Anonymous sessions of ``tenant`` whose parked chain is a prefix of ``keys``."""
        chain = {k for k in keys if k is not None}
        return [
            live.row.session_id
            for live in self.sessions(tenant)
            if live.row.session_id != keep and live.keys and live.keys[-1] in chain
        ]

    def supersede(self, live: LiveSession) -> None:
        """An anonymous conversation's new turn is parked: its older turns go (their
        blocks are this one's prefix, so they stay in the tier)."""
        if not is_anonymous(live):
            return
        tenant, session_id = live.key
        for old in self.superseded(tenant, live.keys, session_id):
            self.drop(tenant, old, "superseded")

    def room(self, candidates: list[HostTier], blocks: int, keep: str) -> list[HostTier]:
        """The candidates where an anonymous copy of ``blocks`` fits in the share."""
        return [t for t in candidates if self.make_room(t.name, t.capacity_blocks, blocks, keep)]

    def make_room(self, tier_name: str, capacity: int, blocks: int, keep: str) -> bool:
        """Delete the oldest anonymous copies in ``tier_name`` until ``blocks`` more fit in
        the share; False when they cannot (the turn is then not parked)."""
        limit = int(self.policy.share * capacity)
        if blocks > limit:
            return False
        parked = sorted(
            (
                live
                for live in self.sessions()
                if live.row.state == State.PARKED and live.row.tier == tier_name
            ),
            key=lambda live: live.row.last_active_at,
        )
        used = sum(len(live.slots) for live in parked)
        for live in parked:
            if used + blocks <= limit:
                break
            held = len(live.slots)
            if live.row.session_id == keep or live.busy:
                continue
            if self.drop(live.row.tenant, live.row.session_id, "over the anonymous share"):
                used -= held
        return used + blocks <= limit

    def expire(self, now: float | None = None) -> int:
        """Drop anonymous sessions whose last turn is older than the TTL; how many."""
        cutoff = (time.time() if now is None else now) - self.policy.ttl_s
        dropped = 0
        for live in self.sessions():
            if live.row.last_active_at < cutoff and not live.busy:
                dropped += self.drop(live.row.tenant, live.row.session_id, "ttl")
        return dropped

    def drop(self, tenant: str, session_id: str, why: str) -> bool:
        try:
            self.core.delete(tenant, session_id)
        except AgentparkError as exc:
            log.info("anonymous session %s/%s not dropped (%s): %s", tenant, session_id, why, exc)
            return False
        return True
