"""Turns: what each engine request did to its session, derived from the event log only.

An event names the engine request it served (``events.request_id``, stamped by
agentpark.parking.events while vLLM's connector drives the session); a turn is the
events of one request id. Nothing else records turns: the events are the one source.

A client sees another id than the engine: vLLM's OpenAI server answers a chat
completion as ``chatcmpl-<id>`` (its stream chunks too) and the engine runs it as
``chatcmpl-<id>-<8 hex>`` (vllm/v1/engine/input_processor.py ``assign_request_id``),
``cmpl-<id>`` likewise for completions. A lookup takes either: the id exactly, or the
id the client saw followed by vLLM's suffix; the newest such request when several match.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from datetime import UTC, datetime

from agentpark.enums import EventKind, RestoredFrom, Tier
from agentpark.errors import RequestNotFoundError
from agentpark.eventstream import EventHub
from agentpark.schemas.sessions import EventOut
from agentpark.schemas.turns import TurnDecision, TurnOut
from agentpark.store.models import EventRow
from agentpark.store.repository import SessionStore

__all__ = ["MAX_TURNS", "Turns", "build_turn", "sees"]

MAX_TURNS = 1000
"""The most turns one listing returns."""

_EVENTS_PER_LOOKUP = 1000  # events read for one request id (a reused id: its newest)
_SUFFIX = re.compile(r"-[0-9a-f]{8}")
_END = {
    EventKind.PAUSE: TurnDecision.PARKED,
    EventKind.KEEP: TurnDecision.KEPT,
    EventKind.PIN: TurnDecision.PINNED,
    EventKind.DROP: TurnDecision.DROPPED,
    EventKind.PAUSE_FAILED: TurnDecision.NOT_PARKED,
}
_START = {
    EventKind.RESUME: TurnDecision.RESTORED,
    EventKind.RECOMPUTE: TurnDecision.RECOMPUTED,
    EventKind.RESTORE_FAILED: TurnDecision.RESTORE_FAILED,
}
_TOKENS = re.compile(r"tokens=(\d+)")


def sees(asked: str, request_id: str) -> bool:
    """Whether ``request_id`` (the engine's) is the request a client knows as ``asked``."""
    if request_id == asked:
        return True
    tail = request_id[len(asked) :]
    return request_id.startswith(asked) and _SUFFIX.fullmatch(tail) is not None


def _at(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def build_turn(events: Sequence[EventRow], block_size: int, block_nbytes: int) -> TurnOut:
    """One request's turn from its events (oldest first, at least one)."""
    first, last = events[0], events[-1]
    start = next((e for e in reversed(events) if e.kind in _START), None)
    end = next((e for e in reversed(events) if e.kind in _END), None)
    turn = next((e for e in reversed(events) if e.kind == EventKind.TURN), None)
    decision, why = TurnDecision.RECORDED, None
    restored_tokens, restored_from = 0, None
    if start is not None:
        decision = _START[EventKind(start.kind)]
        if decision == TurnDecision.RESTORED:
            blocks = (start.bytes or 0) // block_nbytes if block_nbytes else 0
            restored_tokens = blocks * block_size
            restored_from = _opt_from(start.from_tier)
            why = f"restored {restored_tokens} tokens from the {start.from_tier} tier"
        else:
            restored_from = RestoredFrom.RECOMPUTE if start.kind == EventKind.RECOMPUTE else None
            why = start.detail
    if end is not None:
        decision = _END[EventKind(end.kind)]
        why = end.detail if end.kind != EventKind.PAUSE else _parked_why(end)
    tool = None
    if end is not None and end.kind == EventKind.PAUSE:
        # A pause's detail: "tool=NAME", then "shared=N" when the tier held some blocks.
        words = (end.detail or "").split(" ")
        tool = next((w[len("tool=") :] for w in words if w.startswith("tool=")), None)
    found = _TOKENS.search(turn.detail or "") if turn is not None else None
    parked = end is not None and end.kind == EventKind.PAUSE
    return TurnOut(
        request_id=str(first.request_id),
        session_id=first.session_id,
        started_at=_at(first.at),
        ended_at=_at(last.at),
        ended=end is not None,
        decision=decision,
        why=why,
        restored_tokens=restored_tokens,
        restored_from=restored_from,
        restore_ms=None if start is None else start.duration_ms,
        restore_bytes=None if start is None else start.bytes,
        parked_tier=Tier(end.to_tier) if parked and end and end.to_tier else None,
        park_ms=end.duration_ms if parked and end else None,
        park_bytes=end.bytes if parked and end else None,
        tool=tool,
        tokens=int(found.group(1)) if found else None,
        events=[EventOut.of(e) for e in events],
    )


def _parked_why(event: EventRow) -> str:
    """A pause event records its tier and reason, not the advisor's words (kept ones do)."""
    why = f"parked into the {event.to_tier} tier ({event.reason})"
    return f"{why}, {event.detail}" if event.detail else why


def _opt_from(tier: str | None) -> RestoredFrom | None:
    return None if tier is None else RestoredFrom(tier)


class Turns:
    """The turns of a tenant's sessions and requests, read from ``store``."""

    def __init__(self, store: SessionStore, block_size: int, block_nbytes: int) -> None:
        self.store = store
        self.block_size = block_size
        self.block_nbytes = block_nbytes

    def of_session(self, tenant: str, session_id: str, limit: int) -> list[TurnOut]:
        """The session's last ``limit`` turns, newest first ([] for one with none)."""
        ids = self.store.last_request_ids(tenant, session_id, min(limit, MAX_TURNS))
        by_id: dict[str, list[EventRow]] = {}
        for event in self.store.events_of_requests(tenant, ids):
            by_id.setdefault(str(event.request_id), []).append(event)
        return [self._turn(by_id[i]) for i in ids if i in by_id]

    def of_request(self, tenant: str, asked: str) -> TurnOut:
        """The turn of the request a client knows as ``asked``; RequestNotFoundError."""
        turn = self.find(tenant, asked)
        if turn is None:
            raise RequestNotFoundError(asked)
        return turn

    def find(self, tenant: str, asked: str) -> TurnOut | None:
        """:meth:`of_request`, None for a request no event names."""
        found = [
            e
            for e in self.store.request_events(tenant, asked, _EVENTS_PER_LOOKUP)
            if e.request_id is not None and sees(asked, e.request_id)
        ]
        if not found:
            return None
        newest = found[-1].request_id
        return self._turn([e for e in found if e.request_id == newest])

    async def ended(self, hub: EventHub, tenant: str, asked: str, wait_s: float) -> TurnOut:
        """:meth:`of_request` once the turn's end is recorded, waiting up to ``wait_s``
        for it (woken by the events that name the request, never polling); after that,
        what is recorded by then (RequestNotFoundError for nothing)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        waiter = hub.waiter(tenant, lambda request_id: sees(asked, request_id))
        try:  # registered before the first read: an event committed meanwhile wakes it
            while True:
                turn = await asyncio.to_thread(self.find, tenant, asked)
                left = deadline - loop.time()
                if (turn is not None and turn.ended) or left <= 0:
                    break
                await waiter.wait(left)
        finally:
            hub.remove_waiter(waiter)
        if turn is None:
            raise RequestNotFoundError(asked)
        return turn

    def _turn(self, events: Sequence[EventRow]) -> TurnOut:
        return build_turn(events, self.block_size, self.block_nbytes)
