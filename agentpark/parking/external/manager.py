"""The external manager: the session core driven by an engine that runs the model itself.

Shaped like vLLM's ``OffloadingManager`` (vllm/v1/kv_offload/abstract.py), per session:

- :meth:`~ExternalManager.lookup`: how many tokens of a request's prefix the session's
  parked copy can provide (whole blocks of the longest common prefix of token ids,
  always leaving one to compute); no side effect, asked on every scheduling attempt.
- :meth:`~ExternalManager.prepare_store` / :meth:`~ExternalManager.complete_store`: a
  turn ended; keep it in the pool, or plan a park (slots reserved, the session PAUSING and
  held) that the engine copies and then reports: PARKED with its checksum, or not parked.
- :meth:`~ExternalManager.prepare_load` / :meth:`~ExternalManager.complete_load`: take the
  parked copy (RESUMING, held) and name its slots; the engine loads and reports: ACTIVE,
  or, for a copy that failed its checksum, dropped (``corrupt``) and recomputed.
- :meth:`~ExternalManager.take_events`: what was stored and removed since the last call.

A plan the engine never finishes (it died) is failed by :meth:`~ExternalManager.expire`.
Every change of state is the core's (agentpark.parking.transitions), the same as for the
in-process engine; plans are plain values (agentpark.parking.external.plans).
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Sequence

from agentpark.blocks import PoolGeometry
from agentpark.enums import Decision, EventKind, Reason, RestoredFrom, State, TierChoice
from agentpark.errors import InvalidStateError, NotFoundError, TransferError
from agentpark.parking.core import PauseOrder, PauseResult, SessionCore
from agentpark.parking.external.host import ExternalHost
from agentpark.parking.external.lookup import Lookup
from agentpark.parking.external.plans import (
    BlocksRemoved,
    BlocksStored,
    KVEvent,
    LoadInFlight,
    LoadPlan,
    Restored,
    StoreInFlight,
    StorePlan,
)
from agentpark.parking.registry import LiveSession
from agentpark.store.models import EventRow
from agentpark.tiers.base import HostTier

__all__ = ["EVENTS_KEPT", "ExternalManager"]

log = logging.getLogger(__name__)

EVENTS_KEPT = 4096
"""The most stored/removed events kept for :meth:`ExternalManager.take_events`; older
ones are dropped first (a consumer that stops asking must not grow the daemon)."""


_NOT_REMOVED = frozenset({EventKind.RESTORE_FAILED, EventKind.RECOMPUTE})


class ExternalManager(Lookup):
    """Plans of parks and loads for an engine that copies its own blocks."""

    def __init__(self, core: SessionCore, host: ExternalHost) -> None:
        super().__init__(core, host)
        self._ids = itertools.count(1)
        self._plans_lock = threading.Lock()
        self._stores: dict[int, StoreInFlight] = {}
        self._loads: dict[int, LoadInFlight] = {}
        self._events: collections.deque[KVEvent] = collections.deque(maxlen=EVENTS_KEPT)
        core.add_listener(self._on_event)

    # ---- store --------------------------------------------------------------------------

    def prepare_store(
        self,
        tenant: str,
        session_id: str,
        tokens: Sequence[int],
        block_ids: Sequence[int],
        *,
        tool: str | None = None,
        expected_resume_s: float | None = None,
        tier: str = TierChoice.AUTO,
        owner: str | None = None,
        request_id: str | None = None,
    ) -> PauseResult | StorePlan:
        """A turn ended: record it (creating the session if new), then keep (a
        PauseResult) or plan a park (a StorePlan).

        ``block_ids[i]`` holds tokens ``i*block_size ..`` of ``tokens``. For a park the
        session is PAUSING and held until :meth:`complete_store`; the engine must keep its
        blocks until it has copied them. Raises SessionBusyError when another operation
        holds the session, TierFullError when no tier has room (the turn is recorded).
        ``request_id``: the engine's request whose turn ended; its events name it.
        """
        core = self.core
        needed = self.geometry.blocks_for(len(tokens))
        if len(block_ids) != needed:
            raise ValueError(f"{len(tokens)} tokens need {needed} blocks, got {len(block_ids)}")
        candidates = core.mover.candidates(tier)
        if core.registry.find((tenant, session_id)) is None:
            core.create(tenant, session_id, {"engine": "external"})
        live = core.live(tenant, session_id)
        core.registry.acquire(live, "pause")
        live.request_id = request_id
        pending: list[EventRow] = []
        try:
            pending = core.transitions.turn(live, tokens, block_ids)
            order = PauseOrder(
                tier=tier, tool=tool, expected_resume_s=expected_resume_s, reason=Reason.TURN_END
            )
            advice = core.advise(live.row, order)
            if not advice.park or not live.block_table:
                why = advice.why if live.block_table else "no whole block to park"
                core.transitions.keep(live, tool, advice.expected_s, why, pending)
                core.registry.release(live)
                return PauseResult(live.row, Decision.KEPT, why, advice.expected_s, 0.0)
            dst, slots = core.transitions.begin_park(live, candidates)
        except BaseException:
            if pending:
                core.transitions.commit(live, *pending)
            core.registry.release(live)
            raise
        plan = StorePlan(
            next(self._ids),
            dst.name,
            tuple(slots),
            core.mover.checksummed(dst),
            advice.why,
            advice.expected_s,
        )
        with self._plans_lock:
            self._stores[plan.store_id] = StoreInFlight(
                plan, live.key, dst, slots, tool, pending, owner
            )
        return plan

    def complete_store(
        self,
        store_id: int,
        ok: bool,
        checksum: str | None,
        detail: str | None = None,
        *,
        owner: str | None = None,
    ) -> PauseResult | None:
        """The engine copied the blocks (``ok``, with the copy's checksum) or failed.

        ``ok``: PARKED, the slots hold the copy. Not ``ok``: NOT_PARKED, the slots freed
        and the session ACTIVE as before (a ``pause_failed`` event says why). None for a
        plan that is unknown (finished already, or expired).
        """
        with self._plans_lock:
            _check_owner(self._stores.get(store_id), owner, f"store {store_id}")
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
            if not ok:
                failure = TransferError(detail or "the engine's copy failed", operation="pause")
                core.transitions.abort_park(live, store.dst, failure, store.pending)
                return PauseResult(row, Decision.NOT_PARKED, failure.message, plan.expected_s, None)
            digest = checksum if plan.checksum else None
            store.dst.flush()
            ms = core.transitions.finish_park(
                live,
                store.dst,
                store.slots,
                digest,
                store.started,
                store.tool,
                plan.expected_s,
                Reason.TURN_END,
                prior=store.pending,
            )
            return PauseResult(row, Decision.PARKED, plan.why, plan.expected_s, ms)
        finally:
            core.registry.release(live)

    # ---- load ---------------------------------------------------------------------------

    def prepare_load(
        self,
        tenant: str,
        session_id: str,
        tokens: Sequence[int],
        start_block: int,
        block_ids: Sequence[int],
        only_tier: str | None = None,
        owner: str | None = None,
        request_id: str | None = None,
    ) -> LoadPlan:
        """Take the parked copy for a load of its blocks ``start_block ..`` into
        ``block_ids[start_block:]`` (``block_ids``: the request's blocks from its first);
        the session is RESUMING and held until :meth:`complete_load`. ``only_tier``: the
        copy must be in that tier (the only one the engine reads). ``request_id``: the
        engine's request the load serves; its events name it.

        InvalidStateError (or SessionBusyError) when the copy cannot serve that load now.
        """
        core = self.core
        live = core.registry.find((tenant, session_id))
        if live is None:
            raise InvalidStateError("no parked copy of this session")
        core.registry.acquire(live, "restore")
        live.request_id = request_id
        try:
            row = live.row
            if row.state != State.PARKED or row.tier is None:
                raise InvalidStateError(f"the session is {row.state}, not parked", state=row.state)
            if only_tier is not None and row.tier != only_tier:
                raise InvalidStateError(
                    f"the parked copy is in the {row.tier} tier, not {only_tier}",
                    state=row.state,
                )
            end = len(block_ids)
            if (
                not 0 <= start_block < end
                or self._matched(live.tokens, tokens) < end * self.geometry.block_size
            ):
                raise InvalidStateError("the parked copy does not hold those blocks")
            tier = core.tiers[row.tier]
            core.transitions.begin_restore(live)
        except BaseException:
            core.registry.release(live)
            raise
        plan = LoadPlan(
            next(self._ids),
            tier.name,
            tuple(live.slots[start_block:end]),
            tuple(live.slots),
            row.checksum if core.mover.checksummed(tier) else None,
            start_block,
        )
        tokens_loaded = list(tokens[: end * self.geometry.block_size])
        with self._plans_lock:
            self._loads[plan.load_id] = LoadInFlight(
                plan, live.key, tier, list(block_ids), tokens_loaded, owner
            )
        return plan

    def complete_load(
        self, load_id: int, ok: bool, cause: str | None = None, *, owner: str | None = None
    ) -> Restored:
        """The engine loaded the plan's blocks (``ok``), or did not (``cause``).

        ``cause == "checksum"``: the parked copy is damaged: it is dropped (a ``corrupt``
        event, the session LOST) and the engine recomputes (a ``recompute`` event).
        Another cause (the copy could not be read): the parked copy stays PARKED.
        """
        with self._plans_lock:
            _check_owner(self._loads.get(load_id), owner, f"load {load_id}")
            load = self._loads.pop(load_id, None)
        if load is None:
            return Restored(0, None, "unknown load (finished already or expired)")
        core = self.core
        live = core.registry.find(load.key)
        if live is None:
            return Restored(0, None, "the session was deleted")
        tier_name = load.tier.name
        loaded = len(load.plan.slots)
        try:
            if ok:
                self._finish_load(live, load, State.PARKED, recomputed=False)
                restored = loaded * self.geometry.block_size
                core.counters.prefill_tokens_avoided += restored
                return Restored(restored, RestoredFrom(tier_name), f"restored {restored} tokens")
            if cause == "checksum":
                core.transitions.lose_corrupt(live, tier_name)
                core.transitions.begin_restore(live)
                self._finish_load(live, load, State.LOST, recomputed=True)
                return Restored(0, None, "the parked copy failed its checksum; recomputed")
            failure = TransferError(cause or "the engine could not load", operation="resume")
            core.transitions.abort_restore(live, [], failure, tier_name)
            return Restored(0, None, failure.message)
        finally:
            core.registry.release(live)

    def _finish_load(
        self, live: LiveSession, load: LoadInFlight, from_state: State, *, recomputed: bool
    ) -> None:
        """The engine holds the plan's tokens now (loaded, or recomputed): ACTIVE."""
        self.core.transitions.finish_restore(
            live,
            list(load.block_ids),
            reason=Reason.EXPLICIT,
            started=load.started,
            from_state=from_state,
            recomputed=recomputed,
            tokens=list(load.tokens),
            nbytes=len(load.plan.slots) * self.geometry.block_nbytes,
        )

    # ---- plans that never finish ---------------------------------------------------------

    def expire(self, max_age_s: float) -> int:
        """Fail plans older than ``max_age_s`` (their engine went away); how many."""
        cutoff = time.monotonic() - max_age_s
        with self._plans_lock:
            stores = [i for i, s in self._stores.items() if s.created < cutoff]
            loads = [i for i, ld in self._loads.items() if ld.created < cutoff]
        for store_id in stores:
            self.complete_store(store_id, False, None, "the engine never reported the copy")
        for load_id in loads:
            self.complete_load(load_id, False, "the engine never reported the load")
        return len(stores) + len(loads)

    def fail_all(self, why: str, owner: str | None = None) -> int:
        """Fail every plan in flight (their tier is being replaced), or ``owner``'s (its
        connection closed); how many."""
        with self._plans_lock:
            stores = [i for i, s in self._stores.items() if owner in (None, s.owner)]
            loads = [i for i, ld in self._loads.items() if owner in (None, ld.owner)]
        for store_id in stores:
            self.complete_store(store_id, False, None, why)
        for load_id in loads:
            self.complete_load(load_id, False, why)
        return len(stores) + len(loads)

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


def _check_owner(plan: StoreInFlight | LoadInFlight | None, owner: str | None, what: str) -> None:
    """NotFoundError, before anything changes, for a plan ``owner`` may not finish."""
    if plan is not None and owner is not None and plan.owner != owner:
        raise NotFoundError(f"{what} is not a plan of this connection")
