"""The steps every transition shares: write a row with its events, mirror the KV into it,
free slots and blocks, the tool's return. Each keeps the registry's tally in step."""

from __future__ import annotations

import time
from collections.abc import Hashable

import numpy as np

from agentpark.enums import EventKind
from agentpark.parking.events import EventLog
from agentpark.parking.mover import Mover
from agentpark.parking.registry import LiveSession, StateTally
from agentpark.parking.types import KVHost
from agentpark.store.models import EventRow

__all__ = ["Steps"]


class Steps:
    """One core's event log, tally, mover and host; the caller holds the session."""

    def __init__(self, events: EventLog, tally: StateTally, mover: Mover, host: KVHost) -> None:
        self.events = events
        self.tally = tally
        self.mover = mover
        self.host = host

    def commit(self, live: LiveSession, *events: EventRow) -> None:
        """Write the row with ``events``; the tally follows the row, written or put back."""
        try:
            self.events.commit(live.row, *events)
        finally:
            self.tally.update(live.row)

    def sync_kv(self, live: LiveSession, log_changed: bool = True) -> None:
        """Mirror the live KV state into the row; the token log only when it changed
        (re-encoding a long log is a millisecond a pause or restore need not pay)."""
        row = live.row
        if log_changed:
            row.num_tokens = len(live.tokens)
            row.token_log = np.asarray(live.tokens, dtype="<i4").tobytes()
            row.next_logits = None if live.next_logits is None else live.next_logits.tobytes()
        row.kv_blocks = len(live.block_table)
        row.kv_bytes = row.kv_blocks * self.host.geometry.block_nbytes
        self.tally.update(row)

    def _failed(
        self, live: LiveSession, kind: EventKind, exc: Exception, **tiers: str | None
    ) -> None:
        self.events.failure(live.row, kind, exc, at=time.time(), **tiers)
        self.tally.update(live.row)

    def free_slots(self, live: LiveSession, tier_name: str | None, *, cache: bool = False) -> None:
        """Let go of the parked copy's slots (a block others share stays theirs).

        ``cache``: the session has its KV back (restored, or recomputed a turn): its blocks
        stay findable by content until their room is needed, so its next park copies only
        what is new. A copy dropped (deleted, lost, expired) is freed outright.
        """
        tier = self.mover.tiers.get(tier_name or "")
        if tier is not None:
            tier.free(live.key, cache=cache)
        live.slots, live.keys, live.digests = [], [], None

    def block_keys(self, live: LiveSession, num_blocks: int) -> list[Hashable | None]:
        """The keys of the session's first ``num_blocks`` blocks, by content: vLLM's hash
        chain of its tokens (with its cache salt and LoRA), namespaced by its tenant so no
        block is shared across tenants. A partial block has no key (None): private."""
        bs = self.mover.geometry.block_size
        chain = self.mover.hasher.chain(
            live.tokens[: num_blocks * bs], cache_salt=live.cache_salt, lora=live.lora
        )
        tenant = live.row.tenant
        keys: list[Hashable | None] = [(tenant, k) for k in chain]
        return keys + [None] * (num_blocks - len(keys))

    def release_blocks(self, live: LiveSession) -> None:
        if live.block_table:
            self.host.release(live, live.block_table)
        live.block_table = []

    def tool_return_events(self, live: LiveSession, now: float) -> list[EventRow]:
        """The agent is back from its tool: its ``tool_return`` event (how long the tool
        took, for learned pauses), unwritten; none when it was not waiting on one."""
        row = live.row
        if row.tool is None or row.paused_at is None:
            return []
        event = self.events.event(
            row,
            EventKind.TOOL_RETURN,
            now,
            to_state=row.state,
            detail=row.tool,
            duration_ms=(now - row.paused_at) * 1e3,
        )
        row.tool, row.expected_resume_at = None, None
        return [event]

    def tool_return(self, live: LiveSession) -> None:
        """:meth:`tool_return_events`, written."""
        events = self.tool_return_events(live, time.time())
        if events:
            self.commit(live, *events)
