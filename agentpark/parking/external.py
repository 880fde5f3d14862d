"""The external driver: the session core driven by an engine that runs the model itself.

A serving engine (vLLM through agentpark's KV connector) owns its pool and its block
allocator. It tells the core two things and asks one:

- :meth:`ExternalDriver.turn_ended`: "this session's turn ended; these blocks hold the KV
  of these tokens". The core's advisor decides park or keep (break-even, learned tool
  pauses); a park copies the blocks into a tier before the call returns, so the engine
  may free them afterwards.
- :meth:`ExternalDriver.lookup`: "what of this token prefix is parked?" The answer is a
  whole number of blocks of the longest common prefix of the request's token ids and the
  parked copy's, matched on ids (a parked copy is only ever loaded for the exact tokens it
  was computed for), and always leaves one token for the engine to compute.
- :meth:`ExternalDriver.restore_prefix`: "load that prefix into these blocks of mine".

An engine in another process (vLLM) copies the bytes itself, between its KV tensors and
the shared tier file, so a park and a load are two phases each:

- park: :meth:`~ExternalDriver.prepare_store` decides park or keep and reserves the tier
  slots (the session shows PAUSING and is held); the engine copies its blocks there, then
  :meth:`~ExternalDriver.complete_store` commits PARKED with the engine's checksum, or
  frees the slots. Nothing is PARKED before the bytes are in.
- load: :meth:`~ExternalDriver.match` says how much is loadable (no side effect, asked on
  every scheduling attempt); :meth:`~ExternalDriver.begin_load` takes the parked copy
  (RESUMING, held) and names its slots; :meth:`~ExternalDriver.load_done` commits the
  restore, or, for a copy that failed its checksum, drops it (``corrupt``) and records
  that the engine recomputes.

A plan the engine never finishes (it died) is failed by :meth:`~ExternalDriver.expire`.

The state machine, tiers, events and checksums are the core's, the same as for the
in-process engine. Where the engine's pool is reachable from this process (host arrays,
:class:`~agentpark.parking.mover.ArrayPool`) the core's mover copies the bytes; an engine
in another process copies them itself between its tensors and the shared tier file.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from agentpark.blocks import PoolGeometry
from agentpark.enums import Decision, EventKind, Reason, RestoredFrom, State, TierChoice
from agentpark.errors import AgentparkError, InvalidStateError, NotFoundError, TransferError
from agentpark.parking.core import CoreOptions, PauseOrder, PauseResult, SessionCore
from agentpark.parking.mover import ArrayPool, Mover
from agentpark.parking.recovery import recover
from agentpark.parking.registry import LiveSession
from agentpark.snapshot import PoolFigures
from agentpark.store.models import EventRow
from agentpark.store.repository import SessionStore
from agentpark.tiers.base import HostTier

__all__ = [
    "ExternalDriver",
    "LoadPlan",
    "Restored",
    "StorePlan",
    "external_core",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Restored:
    """What a restore gave the engine: ``tokens`` prefix tokens now in its blocks."""

    tokens: int
    restored_from: RestoredFrom | None  # None: nothing restored, the engine computes all
    why: str


@dataclass
class StorePlan:
    """A park in flight: slots reserved in ``tier`` for the engine to copy its blocks into."""

    store_id: int
    key: tuple[str, str]
    tier: HostTier
    slots: list[int]
    num_blocks: int
    tool: str | None
    expected_s: float | None
    why: str
    pending: list[EventRow] = field(default_factory=list)  # the turn's, committed with the park
    started: float = field(default_factory=time.perf_counter)
    created: float = field(default_factory=time.monotonic)
    owner: str | None = None  # who may complete it (a control connection); None: anyone


@dataclass
class LoadPlan:
    """A load in flight: parked blocks ``start_block ..`` of a session going into the
    engine's ``block_ids[start_block:]``, from ``slots`` of ``tier``; the engine has blocks
    ``..start_block`` itself (its own prefix cache)."""

    load_id: int
    key: tuple[str, str]
    tier: HostTier
    slots: list[int]  # the slots of the loaded blocks, in order
    parked_slots: list[int]  # the whole parked copy (what the checksum covers)
    checksum: str | None
    start_block: int
    block_ids: list[int]  # the engine's blocks of the request, 0 .. the last loaded one
    tokens: list[int]  # the request's tokens up to the end of the loaded blocks
    started: float = field(default_factory=time.perf_counter)
    created: float = field(default_factory=time.monotonic)
    owner: str | None = None  # who may finish it (a control connection); None: anyone


class ExternalDriver:
    """The core's KV host for an engine that owns its pool; the engine's entry points."""

    backend_name = "external"

    def __init__(self, geometry: PoolGeometry, model_uid: str, pool: ArrayPool | None) -> None:
        self.geometry = geometry
        self.model_uid = model_uid
        self._pool = pool
        self.core: SessionCore  # set by external_core
        self.engine_blocks = geometry.num_blocks  # the engine's pool size, as it reported
        self._ids = itertools.count(1)
        self._plans_lock = threading.Lock()
        self._stores: dict[int, StorePlan] = {}
        self._loads: dict[int, LoadPlan] = {}

    # ---- KVHost -------------------------------------------------------------------------

    def endpoint(self) -> ArrayPool | None:
        return self._pool

    def claim(self, live: LiveSession, n: int) -> list[int]:
        raise InvalidStateError(
            "this session's KV lives in an external engine: it is restored into the "
            "engine's blocks on the session's next turn, not by resume"
        )

    def claim_now(self, live: LiveSession, n: int) -> list[int] | None:
        return None  # restored on the engine's next turn (see claim)

    @contextmanager
    def engine_lock_now(self) -> Iterator[bool]:
        yield False  # the engine is another process: no fast path

    def release(self, live: LiveSession, blocks: Sequence[int]) -> None:
        """Nothing to do: the engine frees its own blocks once the call has returned."""

    def recompute(self, live: LiveSession, blocks: Sequence[int]) -> None:
        raise TransferError("the parked copy is unusable; the engine recomputes the prefix")

    def pool_figures(self) -> PoolFigures:
        """The engine's pool as far as the core knows it: blocks of sessions it holds."""
        block = self.geometry.block_nbytes
        total = self.engine_blocks
        used = min(
            total,
            sum(
                len(live.block_table)
                for live in self.core.registry.all()
                if live.row.state == State.ACTIVE
            ),
        )
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

    # ---- the engine's calls -------------------------------------------------------------

    def turn_ended(
        self,
        tenant: str,
        session_id: str,
        tokens: Sequence[int],
        block_ids: Sequence[int],
        *,
        tool: str | None = None,
        expected_resume_s: float | None = None,
        tier: str = TierChoice.AUTO,
    ) -> PauseResult:
        """Record the turn (creating the session if new), then park or keep its blocks.

        ``block_ids[i]`` holds tokens ``i*block_size ..`` of ``tokens``, in order; the last
        block may be partial. A parked copy from an earlier turn is superseded.
        """
        core = self.core
        needed = self.geometry.blocks_for(len(tokens))
        if len(block_ids) != needed:
            raise ValueError(f"{len(tokens)} tokens need {needed} blocks, got {len(block_ids)}")
        if core.registry.find((tenant, session_id)) is None:
            core.create(tenant, session_id, {"engine": "external"})
        live = core.live(tenant, session_id)
        with core.registry.operation(live, "turn"):
            self._record_turn(live, tokens, block_ids)
        order = PauseOrder(tier=tier, tool=tool, expected_resume_s=expected_resume_s)
        return core.pause(tenant, session_id, order)

    def lookup(self, tenant: str, session_id: str, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` a restore would provide (whole blocks; may be 0)."""
        live = self.core.registry.find((tenant, session_id))
        if live is None or live.row.state != State.PARKED:
            return 0
        return self._matched(live.tokens, tokens)

    def restore_prefix(
        self, tenant: str, session_id: str, tokens: Sequence[int], block_ids: Sequence[int]
    ) -> Restored:
        """Load the parked prefix of ``tokens`` into ``block_ids`` (the engine's blocks).

        Never raises for a copy that cannot be used: the answer then restores 0 tokens
        and says why, and the engine computes the prefix itself.
        """
        core = self.core
        live = core.registry.find((tenant, session_id))
        if live is None:
            return Restored(0, None, "no parked copy of this session")
        try:
            with core.registry.operation(live, "restore"):
                if live.row.state != State.PARKED:
                    return Restored(0, None, f"the session is {live.row.state}, not parked")
                matched = self._matched(live.tokens, tokens)
                n = matched // self.geometry.block_size
                if n == 0 or len(block_ids) < n:
                    return Restored(0, None, "no whole block of the prefix is parked")
                result = core.restore_locked(live, list(block_ids[:n]), Reason.EXPLICIT, matched)
        except AgentparkError as exc:
            return Restored(0, None, exc.message)
        if result.restored_from == RestoredFrom.RECOMPUTE:
            return Restored(0, None, "the parked copy was unusable")
        core.counters.prefill_tokens_avoided += matched
        return Restored(matched, result.restored_from, f"restored {matched} tokens")

    # ---- two phases, for an engine that copies its own bytes -----------------------------

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
    ) -> PauseResult | StorePlan:
        """A turn ended: record it, then keep (a PauseResult) or plan a park (a StorePlan).

        For a park the session is PAUSING and held until :meth:`complete_store`; the
        engine must keep its blocks until it has copied them into the plan's slots.
        Raises SessionBusyError when another operation holds the session, TierFullError
        when no tier has room (the turn is recorded either way).
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
        pending: list[EventRow] = []
        try:
            pending = self._record_turn(live, tokens, block_ids, commit=False)
            order = PauseOrder(tier=tier, tool=tool, expected_resume_s=expected_resume_s)
            advice = core._advise(live.row, order)
            if not advice.park or not live.block_table:
                why = advice.why if live.block_table else "no whole block to park"
                self.core.keep_locked(live, tool, advice.expected_s, why, pending)
                core.registry.release(live)
                return PauseResult(live.row, Decision.KEPT, why, advice.expected_s, 0.0)
            dst, slots = core.mover.reserve(live.key, candidates, len(live.block_table))
            live.row.state = State.PAUSING
        except BaseException:
            if pending:
                core.events.commit(live.row, *pending)
            core.registry.release(live)
            raise
        plan = StorePlan(
            next(self._ids),
            live.key,
            dst,
            slots,
            len(live.block_table),
            tool,
            advice.expected_s,
            advice.why,
            pending,
            owner=owner,
        )
        with self._plans_lock:
            self._stores[plan.store_id] = plan
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

        ``ok``: PARKED, the slots hold the copy. Not ``ok``: the slots are freed and the
        session is ACTIVE as before (a ``pause_failed`` event says why). None for a plan
        that is unknown (finished already, or expired).
        """
        with self._plans_lock:
            _check_owner(self._stores.get(store_id), owner, f"store {store_id}")
            plan = self._stores.pop(store_id, None)
        if plan is None:
            return None
        core = self.core
        live = core.registry.find(plan.key)
        if live is None:  # deleted meanwhile: nothing holds the slots
            plan.tier.free(plan.key)
            return None
        row = live.row
        try:
            if not ok:
                plan.tier.free(live.key)
                row.state = State.ACTIVE
                if plan.pending:
                    core.events.commit(row, *plan.pending)
                failure = TransferError(detail or "the engine's copy failed", operation="pause")
                core.events.failure(
                    row, EventKind.PAUSE_FAILED, failure, at=time.time(), to_tier=plan.tier.name
                )
                return PauseResult(row, Decision.KEPT, failure.message, plan.expected_s, None)
            digest = checksum if core.mover.checksummed(plan.tier) else None
            plan.tier.flush()
            core.release_blocks(live)
            core.commit_parked(
                live,
                plan.tier,
                plan.slots,
                digest,
                plan.num_blocks,
                plan.started,
                plan.tool,
                plan.expected_s,
                Reason.EXPLICIT,
                prior=plan.pending,
            )
            ms = (time.perf_counter() - plan.started) * 1e3
            return PauseResult(row, Decision.PARKED, plan.why, plan.expected_s, ms)
        finally:
            core.registry.release(live)

    def match(
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

    def promote_and_match(
        self,
        tenant: str,
        session_id: str,
        tokens: Sequence[int] | np.ndarray,
        num_computed: int,
        tier: str,
    ) -> int:
        """:meth:`match`, after moving a usable copy parked in another tier (disk, where
        demotion put it) into ``tier``, the one the engine loads from.

        The move is the core's tier-to-tier copy (checksum verified, a ``move`` event),
        done before the answer, under the session's lock. It fails (0 tokens, the engine
        computes) when ``tier`` has no room, the copy is damaged or the session is busy.
        """
        if self.match(tenant, session_id, tokens, num_computed) == 0:
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
        return self.match(tenant, session_id, tokens, num_computed, only_tier=tier)

    def begin_load(
        self,
        tenant: str,
        session_id: str,
        tokens: Sequence[int],
        start_block: int,
        block_ids: Sequence[int],
        only_tier: str | None = None,
        owner: str | None = None,
    ) -> LoadPlan:
        """Take the parked copy for a load of its blocks ``start_block ..`` into
        ``block_ids[start_block:]`` (``block_ids``: the request's blocks from its first);
        the session is RESUMING and held until :meth:`load_done`. ``only_tier``: the copy
        must be in that tier (the only one the engine reads).

        InvalidStateError (or SessionBusyError) when the copy cannot serve that load now.
        """
        core = self.core
        live = core.registry.find((tenant, session_id))
        if live is None:
            raise InvalidStateError("no parked copy of this session")
        core.registry.acquire(live, "restore")
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
            row.state = State.RESUMING
        except BaseException:
            core.registry.release(live)
            raise
        checksum = row.checksum if core.mover.checksummed(tier) else None
        plan = LoadPlan(
            next(self._ids),
            live.key,
            tier,
            live.slots[start_block:end],
            list(live.slots),
            checksum,
            start_block,
            list(block_ids),
            list(tokens[: end * self.geometry.block_size]),
            owner=owner,
        )
        with self._plans_lock:
            self._loads[plan.load_id] = plan
        return plan

    def load_done(
        self, load_id: int, ok: bool, cause: str | None = None, *, owner: str | None = None
    ) -> Restored:
        """The engine loaded the plan's blocks (``ok``), or did not (``cause``).

        ``cause == "checksum"``: the parked copy is damaged: it is dropped (a ``corrupt``
        event, the session LOST) and the engine recomputes (a ``recompute`` event).
        Another cause (the copy could not be read): the parked copy stays PARKED.
        """
        with self._plans_lock:
            _check_owner(self._loads.get(load_id), owner, f"load {load_id}")
            plan = self._loads.pop(load_id, None)
        if plan is None:
            return Restored(0, None, "unknown load (finished already or expired)")
        core = self.core
        live = core.registry.find(plan.key)
        if live is None:
            return Restored(0, None, "the session was deleted")
        row = live.row
        tier_name = plan.tier.name
        try:
            if ok:
                restored = len(plan.slots) * self.geometry.block_size
                self._commit_loaded(live, plan, EventKind.RESUME, tier_name, None)
                core.counters.prefill_tokens_avoided += restored
                return Restored(restored, RestoredFrom(tier_name), f"restored {restored} tokens")
            if cause == "checksum":
                core.drop_corrupt(live, tier_name)
                self._commit_loaded(live, plan, EventKind.RECOMPUTE, None, row.lost_reason)
                return Restored(0, None, "the parked copy failed its checksum; recomputed")
            row.state = State.PARKED
            failure = TransferError(cause or "the engine could not load", operation="resume")
            core.events.failure(
                row, EventKind.RESTORE_FAILED, failure, at=time.time(), from_tier=tier_name
            )
            return Restored(0, None, failure.message)
        finally:
            core.registry.release(live)

    def expire(self, max_age_s: float) -> int:
        """Fail plans older than ``max_age_s`` (their engine went away); how many."""
        cutoff = time.monotonic() - max_age_s
        with self._plans_lock:
            stores = [p.store_id for p in self._stores.values() if p.created < cutoff]
            loads = [p.load_id for p in self._loads.values() if p.created < cutoff]
        for store_id in stores:
            self.complete_store(store_id, False, None, "the engine never reported the copy")
        for load_id in loads:
            self.load_done(load_id, False, "the engine never reported the load")
        return len(stores) + len(loads)

    def fail_all(self, why: str, owner: str | None = None) -> int:
        """Fail every plan in flight (their tier is being replaced), or ``owner``'s (its
        connection closed); how many."""
        with self._plans_lock:
            stores = [i for i, p in self._stores.items() if owner in (None, p.owner)]
            loads = [i for i, p in self._loads.items() if owner in (None, p.owner)]
        for store_id in stores:
            self.complete_store(store_id, False, None, why)
        for load_id in loads:
            self.load_done(load_id, False, why)
        return len(stores) + len(loads)

    def pending(self) -> tuple[int, int]:
        """(stores, loads) in flight."""
        with self._plans_lock:
            return len(self._stores), len(self._loads)

    def _commit_loaded(
        self,
        live: LiveSession,
        plan: LoadPlan,
        kind: EventKind,
        from_tier: str | None,
        detail: str | None,
    ) -> None:
        """The engine holds the plan's tokens now (loaded, or recomputed): ACTIVE."""
        core, row = self.core, live.row
        from_state = row.state
        if kind == EventKind.RESUME:
            core.free_slots(live)
        nbytes = len(plan.slots) * self.geometry.block_nbytes
        elapsed_ms = (time.perf_counter() - plan.started) * 1e3
        now = time.time()
        event = core.events.event(
            row,
            kind,
            now,
            from_state=State.PARKED if kind == EventKind.RESUME else from_state,
            to_state=State.ACTIVE,
            from_tier=from_tier,
            nbytes=nbytes,
            duration_ms=elapsed_ms,
            detail=detail,
        )
        live.tokens = list(plan.tokens)
        live.block_table = list(plan.block_ids)
        row.state, row.tier, row.parked_handle, row.lost_reason = State.ACTIVE, None, None, None
        row.checksum, row.tier_since, row.last_active_at = None, None, now
        if kind == EventKind.RESUME:
            core.mover.measured(nbytes, elapsed_ms)
        core.sync_kv(live)
        core.events.commit(row, event, *self._tool_return(live, now))

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
        now = time.time()
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
            event = core.lose_at_restart(live, why, now)
            live.slots = []
            live.block_table = []
            core.events.commit(row, event)
        self.engine_blocks = geometry.num_blocks
        if tiers is not None:
            self.geometry = geometry
            self.model_uid = model_uid
            core.mover.geometry = geometry
            core.mover.tiers = {t.name: t for t in tiers}

    # ---- steps --------------------------------------------------------------------------

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

    def _record_turn(
        self,
        live: LiveSession,
        tokens: Sequence[int],
        block_ids: Sequence[int],
        commit: bool = True,
    ) -> list[EventRow]:
        """The engine computed a turn: the session holds its tokens in these blocks.

        ``commit=False``: the events are returned for the caller to commit with the
        turn's outcome (one SQLite write per turn end instead of two or three).
        """
        core, row = self.core, live.row
        stale = row.state == State.PARKED
        if stale:
            core.free_slots(live)  # the engine computed this turn anyway: the copy is stale
            row.tier, row.parked_handle, row.checksum, row.tier_since = None, None, None, None
        elif row.state not in (State.ACTIVE, State.LOST):
            raise InvalidStateError(f"cannot end a turn in state {row.state}", state=row.state)
        now = time.time()
        from_state = row.state
        live.tokens = list(tokens)
        live.block_table = list(block_ids)
        live.next_logits = None
        row.state, row.lost_reason, row.last_active_at = State.ACTIVE, None, now
        events = self._tool_return(live, now)
        core.sync_kv(live)
        events.append(
            core.events.event(
                row,
                EventKind.TURN,
                now,
                from_state=from_state,
                to_state=State.ACTIVE,
                nbytes=row.kv_bytes,
                detail=f"tokens={len(tokens)} blocks={len(block_ids)}",
            )
        )
        if commit or stale:  # a freed copy's slots must not stay claimed in SQLite
            core.events.commit(row, *events)
            return []
        return events

    def _tool_return(self, live: LiveSession, now: float) -> list[EventRow]:
        """The tool_return event (as the core's observe_tool_return), uncommitted."""
        row = live.row
        if row.tool is None or row.paused_at is None:
            return []
        event = self.core.events.event(
            row,
            EventKind.TOOL_RETURN,
            now,
            to_state=row.state,
            detail=row.tool,
            duration_ms=(now - row.paused_at) * 1e3,
        )
        row.tool, row.expected_resume_at = None, None
        return [event]


def _check_owner(plan: StorePlan | LoadPlan | None, owner: str | None, what: str) -> None:
    """NotFoundError, before anything changes, for a plan ``owner`` may not finish."""
    if plan is not None and owner is not None and plan.owner != owner:
        raise NotFoundError(f"{what} is not a plan of this connection")


def external_core(
    store: SessionStore,
    geometry: PoolGeometry,
    model_uid: str,
    tiers: Sequence[HostTier],
    *,
    pool: ArrayPool | None = None,
    options: CoreOptions | None = None,
) -> ExternalDriver:
    """A session core for an external engine; the core is ``driver.core``."""
    options = options or CoreOptions()
    driver = ExternalDriver(geometry, model_uid, pool)
    mover = Mover(geometry, tiers, None, options.checksum_tiers)
    driver.core = SessionCore(store, driver, mover, options)
    recover(driver.core)
    return driver
