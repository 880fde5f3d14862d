"""A vLLM turn end's pin or drop, the pin's end, and the pause closed at the next match.

The manager (agentpark.parking.external.manager) decides under the session's lock; this
writes what a pin or a drop is to the session (still ACTIVE: its blocks are vLLM's) with
its event, ends pins (``unpin``, or the record's own expiry), and closes the pause a turn
end opened when the session's next request asks ``match``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Sequence
from dataclasses import replace

from agentpark.enums import EventKind, Reason, State
from agentpark.errors import AgentparkError
from agentpark.parking.core import SessionCore
from agentpark.parking.external.pins import GRACE_S, Pin, Pins, Wait
from agentpark.parking.external.plans import TurnEndAsk, TurnEndChoice, TurnEndFacts
from agentpark.parking.registry import LiveSession
from agentpark.store.models import EventRow

__all__ = ["TurnEnds"]

log = logging.getLogger(__name__)

_CAUSES = {
    "return": Reason.RETURN,
    "timeout": Reason.TIMEOUT,
    "pressure": Reason.PRESSURE,
    "shutdown": Reason.SHUTDOWN,
    "restart": Reason.RESTART,
    "expired": Reason.EXPIRED,
}


class TurnEnds:
    """Pins and drops of one external core, and the waits its turn ends open."""

    def __init__(self, core: SessionCore) -> None:
        self.core = core
        self.pins = Pins()
        core.add_listener(self._on_event)

    # ---- at a turn end (the caller holds the session) -----------------------------------

    def choose(
        self, live: LiveSession, expected_s: float | None, ask: TurnEndAsk, host_room: bool
    ) -> TurnEndChoice:
        """Pin, park or drop by ``ask.choose``; the expected pause is the caller's or the
        tool's (given, learned, prior), else the latest pauses' of any tool."""
        source = "given, learned or configured for its tool"
        if expected_s is None:
            expected_s, source = self.pins.global_pause(ask.quantile)
        facts = TurnEndFacts(
            expected_s=expected_s,
            expected_source=source,
            tokens=len(live.tokens),
            blocks=len(live.block_table),
            block_bytes=self.core.geometry.block_nbytes,
            bandwidth_bps=self.core.bandwidth_bps,
            overhead_s=ask.overhead_s,
            prefill_ms_per_token=ask.prefill_ms_per_token,
            engine_free_blocks=ask.engine_free_blocks,
            engine_total_blocks=ask.engine_total_blocks,
            pinned_blocks=ask.pinned_blocks,
            host_room=host_room,
            pressure=ask.pressure,
            backs_pins=ask.backs_pins,
        )
        choice = ask.choose(facts, ask.rule)
        return replace(choice, expected_s=expected_s)

    def pin(
        self,
        live: LiveSession,
        why: str,
        ttl_s: float,
        tool: str | None,
        expected_s: float | None,
        prior: Sequence[EventRow] = (),
    ) -> None:
        """ACTIVE stays ACTIVE: vLLM holds the blocks until ``ttl_s`` at the latest."""
        now = time.time()
        row = live.row
        blocks = len(live.block_table)
        event = self._event(live, EventKind.PIN, Reason.TURN_END, why, now, row.kv_bytes)
        self._waiting(live, tool, expected_s, now)
        self.core.transitions.commit(live, *prior, event)
        pin = Pin(blocks, len(live.tokens), now, now + ttl_s, expected_s, tool)
        self.pins.add(live.key, pin)

    def drop(
        self,
        live: LiveSession,
        why: str,
        tool: str | None,
        expected_s: float | None,
        prior: Sequence[EventRow] = (),
        *,
        pressure: bool = False,
    ) -> None:
        """vLLM frees the blocks now; the session's next turn recomputes what it evicted.

        A pinned turn dropped under pressure keeps its wait (its start and estimate)."""
        now = time.time()
        reason = Reason.PRESSURE if pressure else Reason.TURN_END
        event = self._event(live, EventKind.DROP, reason, why, now, live.row.kv_bytes)
        if not pressure:
            self._waiting(live, tool, expected_s, now)
        self.core.transitions.commit(live, *prior, event)

    def opened(self, live: LiveSession, tool: str | None) -> None:
        """A turn end (any answer) opens a wait, closed by the next request's match."""
        last = live.keys[-1] if live.keys else self._last_key(live)
        self.pins.open_wait(live.key, Wait(time.time(), tool, last))

    def _last_key(self, live: LiveSession) -> Hashable | None:
        whole = len(live.tokens) // self.core.geometry.block_size
        if not whole or not (live.row.meta or {}).get("anonymous"):
            return None
        return self.core.transitions.block_keys(live, whole)[-1]

    def _waiting(
        self, live: LiveSession, tool: str | None, expected_s: float | None, now: float
    ) -> None:
        row = live.row
        row.paused_at, row.tool = now, tool
        row.expected_resume_at = None if expected_s is None else now + expected_s

    def _event(
        self, live: LiveSession, kind: EventKind, reason: str, why: str, at: float, nbytes: int
    ) -> EventRow:
        row = live.row
        return self.core.events.event(
            row,
            kind,
            at,
            from_state=row.state,
            to_state=row.state,
            reason=reason,
            nbytes=nbytes,
            detail=why,
        )

    # ---- a pin's end ---------------------------------------------------------------------

    def unpin(self, tenant: str, session_id: str, cause: str, reused_tokens: int = 0) -> Pin | None:
        """The connector let the pin go (``cause``): forget it, count it, an ``unpin``
        event; None (nothing changed) when the daemon has no such pin."""
        key = (tenant, session_id)
        geometry = self.core.geometry
        saved = min(reused_tokens, self._pinned_tokens(key))
        nbytes = saved // geometry.block_size * geometry.block_nbytes
        pin = self.pins.end(key, cause, saved, nbytes)
        if pin is None:
            return None
        if saved:
            self.core.counters.prefill_tokens_avoided += saved
        live = self.core.registry.find(key)
        if live is None or live.row.state == State.DELETED:
            return pin
        held = time.time() - pin.since
        why = f"{cause} after {held:.3g}s ({pin.blocks} blocks; {saved} tokens reused)"
        try:
            with self.core.registry.operation(live, "unpin", background=True):
                event = self._event(
                    live,
                    EventKind.UNPIN,
                    _CAUSES.get(cause, Reason.EXPLICIT),
                    why,
                    time.time(),
                    nbytes,
                )
                event.duration_ms = held * 1e3
                self.core.transitions.commit(live, event)
        except AgentparkError as exc:  # the pin is over either way; its event is a record
            log.info("unpin of %s/%s not recorded: %s", tenant, session_id, exc.message)
        return pin

    def _pinned_tokens(self, key: tuple[str, str]) -> int:
        pin = self.pins.get(key)
        return 0 if pin is None else pin.tokens

    def forget_all(self, cause: str) -> int:
        """The engine restarted: its pins went with its blocks (counted, no event: the
        sessions are lost with the rest of the engine's KV)."""
        keys = self.pins.keys()
        for key in keys:
            self.pins.end(key, cause)
        return len(keys)

    def expire(self, now: float | None = None) -> int:
        """End the pins past their time-out + grace with no unpin (the connector died)."""
        lapsed = self.pins.lapsed(now, GRACE_S)
        for tenant, session_id in lapsed:
            self.unpin(tenant, session_id, "expired")
        return len(lapsed)

    # ---- the pause closed at the next match ----------------------------------------------

    def returned(
        self,
        tenant: str,
        session_id: str | None,
        chain: Sequence[Hashable] = (),
        request_id: str | None = None,
    ) -> float | None:
        """The session's next request matched: close its wait with a ``tool_return``
        event (learned per tool; a global window besides). An unnamed request finds its
        anonymous session by its blocks' keys (``chain``). The seconds, or None."""
        key: tuple[str, str] | None = (tenant, session_id) if session_id else None
        if key is None:
            key = self.pins.anonymous_wait(tenant, set(chain)) if chain else None
        if key is None or not self.pins.waiting(key):
            return None
        live = self.core.registry.find(key)
        if live is None or not self.core.registry.try_acquire(live, "return"):
            return None  # busy: its turn (or restore) closes the wait as before
        live.request_id = request_id  # the event names the request that came back
        try:
            wait = self.pins.close_wait(key)
            if wait is None:
                return None
            now = time.time()
            row = live.row
            seconds = now - wait.since
            event = self.core.events.event(
                row,
                EventKind.TOOL_RETURN,
                now,
                to_state=row.state,
                detail=wait.tool,
                duration_ms=seconds * 1e3,
            )
            row.tool, row.expected_resume_at = None, None
            self.core.transitions.commit(live, event)
            return seconds
        except AgentparkError as exc:
            log.info("pause of %s/%s not recorded: %s", *key, exc.message)
            return None
        finally:
            self.core.registry.release(live)

    def _on_event(self, event: EventRow) -> None:
        """Every measured pause feeds the global window (any tool, or none)."""
        if event.kind == EventKind.TOOL_RETURN and event.duration_ms is not None:
            self.pins.observe(event.duration_ms / 1e3)
