"""The external manager: the session core driven by an engine that runs the model itself.

Shaped like vLLM's ``OffloadingManager`` (vllm/v1/kv_offload/abstract.py), per session:

- :meth:`~ExternalManager.lookup`: how many tokens of a request's prefix parked blocks
  can provide: the session's own copy, or any by content (vLLM's block-hash chain, in the
  tenant's namespace), whole blocks, always leaving one to compute; no side effect.
- :meth:`~ExternalManager.prepare_store` / :meth:`~ExternalManager.complete_store`: a
  turn ended; keep it in the pool, or plan a park (slots reserved: those of blocks the
  tier holds already are shared, only the others are copied; the session PAUSING and
  held) that the engine copies and then reports: PARKED with each copied block's digest,
  or not parked. A request with no session name is parked as an anonymous session
  (agentpark.parking.external.anonymous).
- :meth:`~ExternalManager.prepare_load` / :meth:`~ExternalManager.complete_load`
  (agentpark.parking.external.loads): name the slots and digests of the blocks to load;
  the engine loads and reports.
- :meth:`~ExternalManager.take_events`: what was stored and removed since the last call.

A plan the engine never finishes (it died) is failed by :meth:`~ExternalManager.expire`.
Every change of state is the core's (agentpark.parking.transitions), the same as for the
in-process engine; plans are plain values (agentpark.parking.external.plans).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Hashable, Sequence
from dataclasses import replace

import numpy as np

from agentpark.blocks import PoolGeometry
from agentpark.enums import Decision, EventKind, Reason, State, TierChoice
from agentpark.errors import TierFullError, TransferError
from agentpark.parking.core import PauseOrder, PauseResult, SessionCore
from agentpark.parking.external.anonymous import Anonymous, AnonymousPolicy, is_anonymous
from agentpark.parking.external.host import ExternalHost
from agentpark.parking.external.loads import Loads, check_owner
from agentpark.parking.external.lookup import NO_EXTRA, RequestKeys
from agentpark.parking.external.plans import (
    BlocksRemoved,
    BlocksStored,
    KVEvent,
    Pinned,
    StoreInFlight,
    StorePlan,
    TurnEndAsk,
)
from agentpark.parking.external.turnends import TurnEnds
from agentpark.store.models import EventRow
from agentpark.tiers.base import HostTier

__all__ = ["EVENTS_KEPT", "ExternalManager"]

log = logging.getLogger(__name__)

EVENTS_KEPT = 4096
"""The most stored/removed events kept for :meth:`ExternalManager.take_events`; older
ones are dropped first (a consumer that stops asking must not grow the daemon)."""


_NOT_REMOVED = frozenset({EventKind.RESTORE_FAILED, EventKind.RECOMPUTE})


class ExternalManager(Loads):
    """Plans of parks and loads for an engine that copies its own blocks."""

    def __init__(
        self,
        core: SessionCore,
        host: ExternalHost,
        anonymous: AnonymousPolicy | None = None,
    ) -> None:
        super().__init__(core, host)
        self._stores: dict[int, StoreInFlight] = {}
        self._events: collections.deque[KVEvent] = collections.deque(maxlen=EVENTS_KEPT)
        self.anonymous = Anonymous(core, anonymous or AnonymousPolicy())
        self.turn_ends = TurnEnds(core)
        core.add_listener(self._on_event)

    # ---- store --------------------------------------------------------------------------

    def prepare_store(
        self,
        tenant: str,
        session_id: str | None,
        tokens: Sequence[int],
        block_ids: Sequence[int],
        *,
        tool: str | None = None,
        expected_resume_s: float | None = None,
        tier: str = TierChoice.AUTO,
        owner: str | None = None,
        extra: RequestKeys = NO_EXTRA,
        request_id: str | None = None,
        ask: TurnEndAsk | None = None,
    ) -> PauseResult | StorePlan | Pinned:
        """A turn ended: record it (creating the session if new; ``session_id`` None: an
        anonymous one), then keep (a PauseResult) or plan a park (a StorePlan); with
        ``ask`` (the connector's view of vLLM's pool) in adaptive or pin mode, pin (a
        Pinned), park or drop (a PauseResult), as ``ask.choose`` says.

        ``block_ids[i]`` holds tokens ``i*block_size ..`` of ``tokens``. For a park the
        session is PAUSING and held until :meth:`complete_store`; the engine must keep its
        blocks until it has copied those the plan says. Raises SessionBusyError when
        another operation holds the session, TierFullError when no tier has room (the
        turn is recorded). ``ask.pressure``: the session's pinned turn let go (not a new
        turn: it is not recorded again).
        ``request_id``: the engine's request whose turn ended; its events name it.
        """
        core = self.core
        needed = self.geometry.blocks_for(len(tokens))
        if len(block_ids) != needed:
            raise ValueError(f"{len(tokens)} tokens need {needed} blocks, got {len(block_ids)}")
        candidates = core.mover.candidates(tier)
        if session_id is None:
            session_id = self.anonymous.new_id()
            core.create(tenant, session_id, {"engine": "external", "anonymous": True})
        elif core.registry.find((tenant, session_id)) is None:
            core.create(tenant, session_id, {"engine": "external"})
        live = core.live(tenant, session_id)
        anonymous = is_anonymous(live)
        core.registry.acquire(live, "pause")
        live.request_id = request_id
        pressure = ask is not None and ask.pressure
        again = pressure and self.turn_ends.pins.get(live.key) is not None
        again = again and live.tokens == list(tokens) and live.row.state == State.ACTIVE
        reason = Reason.PRESSURE if again else Reason.TURN_END
        pending: list[EventRow] = []
        pin: Pinned | None = None  # a pin with a copy behind it (the plan's answer says so)
        try:
            if not again:  # a new turn: an open wait or a stale pin record are over
                self.turn_ends.pins.close_wait(live.key)
                self.turn_ends.pins.forget(live.key)
                pending = core.transitions.turn(live, tokens, block_ids)
                live.cache_salt, live.lora = extra.cache_salt, extra.lora
            order = PauseOrder(
                tier=tier, tool=tool, expected_resume_s=expected_resume_s, reason=Reason.TURN_END
            )
            advice = core.advise(live.row, order)
            why = advice.why if live.block_table else "no whole block to park"
            park = advice.park and bool(live.block_table)
            # A connector that says nothing of vLLM's pool cannot pin: park or keep, as before.
            adaptive = ask is not None and (ask.active or pressure)
            if ask is not None and adaptive:
                choice = self.turn_ends.choose(live, advice.expected_s, ask, bool(candidates))
                why, park = choice.why, choice.answer == "parked"
                if park and anonymous:
                    candidates = self.anonymous.room(candidates, len(live.block_table), session_id)
                    if not candidates:
                        why = f"{why}; but the anonymous share of the host pool is full: dropped"
                        choice = replace(choice, answer="dropped", why=why)
                if not again:
                    self.turn_ends.opened(live, tool)
                if choice.answer == "pinned":
                    assert choice.pin_ttl_s is not None
                    self.turn_ends.pin(
                        live, why, choice.pin_ttl_s, tool, choice.expected_s, pending
                    )
                    pin = Pinned(live.row, why, choice.expected_s, choice.pin_ttl_s)
                    pending = []  # committed with the pin
                    if choice.backed and anonymous:
                        candidates = self.anonymous.room(
                            candidates, len(live.block_table), session_id
                        )
                    if not choice.backed or not candidates:
                        core.registry.release(live)
                        return pin
                    park, reason = True, Reason.PIN_COPY
                if choice.answer == "dropped":
                    self.turn_ends.drop(live, why, tool, choice.expected_s, pending, pressure=again)
                    core.registry.release(live)
                    return PauseResult(live.row, Decision.DROPPED, why, choice.expected_s, 0.0)
            elif park and anonymous:
                candidates = self.anonymous.room(candidates, len(live.block_table), session_id)
                if not candidates:
                    why = "the anonymous share of the host pool is full"
            if not again and not adaptive:
                self.turn_ends.opened(live, tool)
            if not park or not candidates:
                core.transitions.keep(live, tool, advice.expected_s, why, pending)
                core.registry.release(live)
                return PauseResult(live.row, Decision.KEPT, why, advice.expected_s, 0.0)
            try:
                dst, slots = core.transitions.begin_park(live, candidates)
            except TierFullError as exc:
                if pin is not None:  # the pin holds; no copy behind it
                    core.registry.release(live)
                    return replace(pin, why=f"{why}; but no copy: {exc.message}")
                if not adaptive:
                    raise
                why = f"{why}; but {exc.message}: dropped"
                self.turn_ends.drop(live, why, tool, advice.expected_s, pending, pressure=again)
                core.registry.release(live)
                return PauseResult(live.row, Decision.DROPPED, why, advice.expected_s, 0.0)
        except BaseException:
            if pending:
                core.transitions.commit(live, *pending)
            core.registry.release(live)
            raise
        assert live.pending is not None
        plan = StorePlan(
            next(self._ids),
            dst.name,
            tuple(slots),
            tuple(live.pending.fresh),
            core.mover.checksummed(dst),
            why,
            advice.expected_s,
            pin,
        )
        with self._plans_lock:
            self._stores[plan.store_id] = StoreInFlight(
                plan, live.key, dst, tool, pending, owner, reason
            )
        return plan

    def complete_store(
        self,
        store_id: int,
        ok: bool,
        digests: Sequence[str | None] | None,
        detail: str | None = None,
        *,
        owner: str | None = None,
    ) -> PauseResult | None:
        """The engine copied the plan's blocks (``ok``, with the digest of each block it
        copied, in order) or failed.

        ``ok``: PARKED, the slots hold the copy. Not ``ok``: NOT_PARKED, the slots freed
        and the session ACTIVE as before (a ``pause_failed`` event says why). None for a
        plan that is unknown (finished already, or expired).
        """
        with self._plans_lock:
            check_owner(self._stores.get(store_id), owner, f"store {store_id}")
            store = self._stores.pop(store_id, None)
        if store is None:
            return None
        core = self.core
        live = core.registry.find(store.key)
        if live is None:  # deleted meanwhile: nothing holds the slots
            store.dst.free(store.key)
            return None
        row, plan = live.row, store.plan
        try:
            copied = [s for s, new in zip(plan.slots, plan.fresh, strict=True) if new]
            if ok and plan.checksum and (digests is None or len(digests) != len(copied)):
                ok, detail = False, f"{len(copied)} blocks copied, digests for {len(digests or [])}"
            if not ok:
                failure = TransferError(detail or "the engine's copy failed", operation="pause")
                core.transitions.abort_park(live, store.dst, failure, store.pending)
                return PauseResult(row, Decision.NOT_PARKED, failure.message, plan.expected_s, None)
            by_slot = dict(
                zip(
                    copied,
                    digests if plan.checksum and digests else [None] * len(copied),
                    strict=True,
                )
            )
            store.dst.flush()
            ms = core.transitions.finish_park(
                live,
                store.dst,
                by_slot,
                store.started,
                store.tool,
                plan.expected_s,
                store.reason,
                prior=store.pending,
            )
            self.anonymous.supersede(live)
            return PauseResult(row, Decision.PARKED, plan.why, plan.expected_s, ms)
        finally:
            core.registry.release(live)

    # ---- a request's match: the pause it ends -----------------------------------------------

    def match(
        self,
        tenant: str,
        session_id: str | None,
        tokens: Sequence[int] | np.ndarray,
        num_computed: int,
        tier: str,
        extra: RequestKeys = NO_EXTRA,
        request_id: str | None = None,
    ) -> int:
        """:meth:`promote_and_lookup`, and the session's pause closed (its next request
        is here: agentpark.parking.external.turnends); an unnamed request's anonymous
        session is found by its blocks' keys."""
        found = self.promote_and_lookup(tenant, session_id, tokens, num_computed, tier, extra)
        chain: list[Hashable] = []
        if session_id is None and self.turn_ends.pins.waits_of(tenant):
            chain = list(self._keys(tenant, tokens, extra))
        self.turn_ends.returned(tenant, session_id, chain, request_id)
        return found

    # ---- plans that never finish ---------------------------------------------------------

    def expire(self, max_age_s: float) -> int:
        """Fail plans older than ``max_age_s`` (their engine went away), and drop the
        anonymous copies past their TTL; how many plans."""
        cutoff = time.monotonic() - max_age_s
        with self._plans_lock:
            stores = [i for i, s in self._stores.items() if s.created < cutoff]
        for store_id in stores:
            self.complete_store(store_id, False, None, "the engine never reported the copy")
        expired = len(stores) + self.expire_loads(cutoff)
        self.anonymous.expire()
        self.turn_ends.expire()
        return expired

    def fail_all(self, why: str, owner: str | None = None) -> int:
        """Fail every plan in flight (their tier is being replaced), or ``owner``'s (its
        connection closed); how many."""
        with self._plans_lock:
            stores = [i for i, s in self._stores.items() if owner in (None, s.owner)]
        for store_id in stores:
            self.complete_store(store_id, False, None, why)
        return len(stores) + self.fail_loads(why, owner)

    def pending(self) -> tuple[int, int]:
        """(stores, loads) in flight."""
        with self._plans_lock:
            return len(self._stores), len(self._loads)

    # ---- events -------------------------------------------------------------------------

    def take_events(self) -> list[KVEvent]:
        """The copies stored and removed since the last call, oldest first."""
        with self._plans_lock:
            taken = list(self._events)
            self._events.clear()
        return taken

    def _on_event(self, event: EventRow) -> None:
        """Every committed core event: a copy that landed in a tier or left one."""
        block = self.geometry.block_nbytes
        n = (event.bytes or 0) // block if block else 0
        made: list[KVEvent] = []
        key = (event.tenant, event.session_id)
        if event.from_tier is not None and event.kind not in _NOT_REMOVED:
            made.append(BlocksRemoved(*key, event.from_tier, n, event.at))
        if event.to_tier is not None and event.kind in (EventKind.PAUSE, EventKind.MOVE):
            made.append(BlocksStored(*key, event.to_tier, n, event.at))
        if made:
            with self._plans_lock:
                self._events.extend(made)

    # ---- a new engine layout --------------------------------------------------------------

    def attach(
        self,
        geometry: PoolGeometry,
        model_uid: str,
        tiers: Sequence[HostTier] | None,
        why_parked_lost: str | None = None,
    ) -> None:
        """An engine (re)started with ``geometry``: what it held in its pool is gone.

        Sessions whose KV was in the engine (ACTIVE with tokens) become LOST. With
        ``tiers`` (a new layout, or new host memory: the old tiers were closed by the
        caller), sessions parked in the old tiers become LOST too (``why_parked_lost``
        says why; default: the layout changed) and the core uses the new ones.
        """
        core = self.core
        self.turn_ends.forget_all("shutdown")  # the engine's blocks are gone, pinned or not
        for live in core.registry.all():
            row = live.row
            if row.state == State.ACTIVE and live.tokens:
                why = "the engine restarted: the KV in its pool is gone"
            elif row.state == State.PARKED and tiers is not None:
                why = why_parked_lost or (
                    f"the engine's KV layout changed ({model_uid}): the parked copy is unusable"
                )
            else:
                continue
            if live.busy:
                continue
            core.transitions.lose(live, Reason.RESTART, why, free=False)
            live.slots = []  # their tiers (or the engine's pool) are gone: nothing to free
            live.block_table = []
        self.host.engine_blocks = geometry.num_blocks
        if tiers is not None:
            self.host.relayout(geometry, model_uid)
            core.mover.relayout(geometry, tiers)
