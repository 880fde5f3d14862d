"""The session state machine: create, generate, pause, resume, delete, recompute.

::

                pause                 copy done
     ACTIVE ----------> PAUSING ------------------> PARKED(tier)
       ^                                              |
       |  copy done         resume / generate         |
       +---------- RESUMING <-------------------------+
       |                                              | parked copy gone (restart)
       +---------- RECOMPUTING <--------------------- LOST
     any state --delete--> DELETED (blocks and tier slots freed, row kept)

One operation at a time per session: a second one on the same session is refused with
409 session_busy rather than queued, so a caller never waits behind a slow copy it did
not ask for. Nothing is freed before its copy is complete, and a failed step leaves the
session where it was. Every session keeps its token log, so KV that is gone is rebuilt
by re-prefill: slower, never lost.

Everything here is synchronous and thread-safe; the API calls it from worker threads.
The KV invariant: a session with KV holds exactly ``blocks_for(len(tokens))`` blocks
covering every token of its log, and ``next_logits`` are the logits after the last one.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import Any, TypeVar

import numpy as np

from agentpark.blocks import PoolExhaustedError
from agentpark.dma.base import Transfer
from agentpark.dma.tier_copy import copy_between_tiers
from agentpark.engine.base import EngineAdapter
from agentpark.engine.sampling import sample
from agentpark.errors import (
    AgentparkError,
    InvalidRequestError,
    InvalidStateError,
    LimitExceededError,
    NotReadyError,
    PoolFullError,
    SessionBusyError,
    SessionExistsError,
    SessionNotFoundError,
    TierFullError,
    TransferError,
)
from agentpark.integrity import checksum
from agentpark.store.models import EventRow, SessionRow
from agentpark.store.repository import SessionStore
from agentpark.tiers.base import HostTier

__all__ = [
    "GenerateResult",
    "MoveResult",
    "Parking",
    "ParkingOptions",
    "PauseResult",
    "ResumeResult",
    "State",
]

log = logging.getLogger(__name__)

SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
TIER_NAMES = ("auto", "dram", "shm", "disk")


class State(StrEnum):
    ACTIVE = "active"
    PAUSING = "pausing"
    PARKED = "parked"
    RESUMING = "resuming"
    RECOMPUTING = "recomputing"
    LOST = "lost"
    DELETED = "deleted"


@dataclass
class _Live:
    """A session's in-process half: what only this process can know (blocks, slots)."""

    row: SessionRow
    tokens: list[int]
    next_logits: np.ndarray | None
    block_table: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    operation: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.row.tenant, self.row.session_id)


@dataclass(frozen=True)
class GenerateResult:
    row: SessionRow
    tokens: list[int]
    text: str
    resumed: bool
    restored_from: str | None
    resume_ms: float | None
    next_logits: np.ndarray


@dataclass(frozen=True)
class PauseResult:
    row: SessionRow
    pause_ms: float | None  # None: still in flight (wait=False)


@dataclass(frozen=True)
class ResumeResult:
    row: SessionRow
    restored_from: str
    resume_ms: float | None  # None: still in flight (wait=False)


@dataclass(frozen=True)
class MoveResult:
    row: SessionRow
    from_tier: str
    move_ms: float


_R = TypeVar("_R")


@dataclass
class Counters:
    """Since this daemon started; the durable history is the events table."""

    pauses: int = 0
    resumes: int = 0
    recomputes: int = 0
    bytes_parked: int = 0
    bytes_restored: int = 0
    tokens_generated: int = 0


@dataclass(frozen=True)
class ParkingOptions:
    max_new_tokens: int = 512
    checksum_tiers: frozenset[str] = frozenset({"shm", "disk"})
    background_workers: int = 4


class Parking:
    """Owns the live sessions and drives the engine, the DMA core and the tiers for them."""

    def __init__(
        self,
        store: SessionStore,
        engine: EngineAdapter,
        transfer: Transfer,
        tiers: Sequence[HostTier],
        options: ParkingOptions | None = None,
    ) -> None:
        self.store = store
        self.engine = engine
        self.transfer = transfer
        # In auto order: the first with room takes a pause (dram, then shm, then disk).
        self.tiers: dict[str, HostTier] = {t.name: t for t in tiers}
        self.options = options or ParkingOptions()
        self.max_new_tokens = self.options.max_new_tokens
        self.counters = Counters()
        self.draining = False
        # Measured copy speed (bytes/s, moving average of pauses and restores): the
        # break-even and prefetch rules price a round trip with it.
        self.bandwidth_bps = 5e9
        # Called with every event after it is committed (metrics, policy); must not raise.
        self.listeners: list[Callable[[EventRow], None]] = []
        self._sessions: dict[tuple[str, str], _Live] = {}
        # Events written while re-attaching at start, before any listener could be added:
        # add_listener replays them, so metrics count sessions lost to a restart too.
        self.startup_events: list[EventRow] = []
        self._registry_lock = threading.Lock()
        self._background = ThreadPoolExecutor(
            self.options.background_workers, thread_name_prefix="agentpark-copy"
        )
        self._reconcile()

    def add_listener(self, listener: Callable[[EventRow], None]) -> None:
        """Call ``listener`` with every committed event, starting with those of start-up."""
        for event in self.startup_events:
            listener(event)
        self.listeners.append(listener)

    def close(self) -> None:
        """Wait for background copies (wait=false pauses and resumes) to finish."""
        self._background.shutdown(wait=True)

    # ---- start-up -------------------------------------------------------------------

    def _reconcile(self) -> None:
        """Re-attach sessions from SQLite.

        KV in the pool or the dram tier died with the last process: those sessions become
        LOST (recomputed on resume). Sessions parked in a persistent tier whose file was
        re-attached keep their slots and stay PARKED.
        """
        now = time.time()
        for row in self.store.live_rows():
            live = _Live(row, _decode_tokens(row.token_log), _decode_logits(row.next_logits))
            reason = self._lost_reason_at_start(live)
            if reason is not None:
                event = self._event(row, "lost", now, to_state=State.LOST, detail=reason)
                event.from_state, event.from_tier, event.reason = row.state, row.tier, "restart"
                event.bytes = row.kv_bytes
                self._mark_lost(live, reason)
                self.store.save(row, event)
                self.startup_events.append(event)
            elif row.state not in (State.PARKED, State.LOST, State.ACTIVE):
                row.state = State.ACTIVE  # no tokens, so no KV to lose
                self.store.save(row)
            self._sessions[live.key] = live
        if self._sessions:
            log.info("re-attached %d sessions", len(self._sessions))

    def _lost_reason_at_start(self, live: _Live) -> str | None:
        row = live.row
        if row.state == State.LOST:
            return None
        if row.state != State.PARKED:
            if row.num_tokens == 0:
                return None
            return "daemon restarted: the KV pool is process memory"
        tier = self.tiers.get(row.tier or "")
        if tier is None:
            return f"daemon restarted: the {row.tier} tier is not enabled"
        if not tier.persistent:
            return f"daemon restarted: the {row.tier} tier is process memory"
        problem = getattr(tier, "attach_problem", None)
        if problem:
            return f"{tier.name} tier file refused at start: {problem}"
        if not getattr(tier, "reattached", False):
            return f"the {tier.name} tier file was gone at start (reboot or cleanup)"
        slots = list((row.parked_handle or {}).get("slots", []))
        if len(slots) != row.kv_blocks:
            return f"parked copy index is inconsistent ({len(slots)} slots, {row.kv_blocks} blocks)"
        try:
            tier.claim(live.key, slots)
        except ValueError as exc:
            return f"cannot re-attach its {tier.name} slots: {exc}"
        live.slots = slots
        return None

    # ---- lookups --------------------------------------------------------------------

    def get(self, tenant: str, session_id: str) -> SessionRow:
        """A session by id, deleted ones included (their rows are history)."""
        live = self._sessions.get((tenant, session_id))
        if live is not None:
            return live.row
        row = self.store.get(tenant, session_id)
        if row is None:
            raise SessionNotFoundError(session_id)
        return row

    def page(self, tenant: str, state: str | None, limit: int, after_seq: int) -> list[SessionRow]:
        """A page from SQLite, with in-flight states (pausing, resuming) from memory."""
        rows = self.store.page(tenant, state, limit, after_seq)
        return [self._live_row(r) for r in rows]

    def _live_row(self, row: SessionRow) -> SessionRow:
        live = self._sessions.get((row.tenant, row.session_id))
        return live.row if live is not None else row

    def events(self, tenant: str, session_id: str | None, limit: int) -> Sequence[EventRow]:
        return self.store.events(tenant, session_id, limit)

    def snapshot(self) -> list[tuple[SessionRow, bool]]:
        """Every live session and whether an operation holds it now (for the policy loop)."""
        with self._registry_lock:
            return [(live.row, live.lock.locked()) for live in self._sessions.values()]

    def live_sessions(self) -> list[SessionRow]:
        with self._registry_lock:
            return [live.row for live in self._sessions.values()]

    # ---- create and delete ----------------------------------------------------------

    def create(
        self, tenant: str, session_id: str | None, metadata: dict[str, Any] | None
    ) -> SessionRow:
        self._refuse_if_draining()
        session_id = session_id or uuid.uuid4().hex
        if not SESSION_ID_RE.match(session_id):
            raise InvalidRequestError(
                "session_id must be 1-128 characters of letters, digits and ._:- "
                "starting with a letter or digit",
                session_id=session_id,
            )
        now = time.time()
        with self._registry_lock:
            if (tenant, session_id) in self._sessions or self.store.get(tenant, session_id):
                raise SessionExistsError(session_id)
            row = SessionRow(
                session_id=session_id,
                tenant=tenant,
                state=State.ACTIVE,
                tier=None,
                num_tokens=0,
                kv_blocks=0,
                kv_bytes=0,
                created_at=now,
                last_active_at=now,
                pause_count=0,
                meta=metadata or {},
                token_log=b"",
            )
            event = self._event(row, "create", now, to_state=State.ACTIVE)
            self.store.insert(row, event)
            self._notify(event)
            self._sessions[(tenant, session_id)] = _Live(row, [], None)
        return row

    def delete(self, tenant: str, session_id: str) -> None:
        """Free everything the session holds; idempotent for an already deleted session."""
        live = self._sessions.get((tenant, session_id))
        if live is None:
            self.get(tenant, session_id)  # 404 if it never existed; deleted: nothing to do
            return
        with self._operation(live, "delete"):
            row = live.row
            now = time.time()
            event = self._event(row, "delete", now, to_state=State.DELETED)
            event.bytes = row.kv_bytes
            self._free_blocks(live)
            self._free_slots(live)
            row.state, row.tier, row.deleted_at = State.DELETED, None, now
            row.kv_blocks = row.kv_bytes = 0
            row.parked_handle = None
            self._commit(row, event)
            with self._registry_lock:
                del self._sessions[live.key]

    def adopt_kv(
        self,
        tenant: str,
        session_id: str,
        tokens: Sequence[int],
        block_ids: Sequence[int],
        next_logits: np.ndarray,
    ) -> SessionRow:
        """Give a new, empty session KV that was prefilled outside agentpark.

        For engine adapters that prefill on their own and for benchmarks. ``block_ids``
        must already be allocated to the session in ``engine.allocator``, number exactly
        ``blocks_for(len(tokens))`` and hold the KV of ``tokens`` in order; ``next_logits``
        are the logits after the last token.
        """
        live = self._live(tenant, session_id)
        with self._operation(live, "adopt"):
            row = live.row
            if row.state != State.ACTIVE or live.tokens or live.block_table:
                raise InvalidStateError("only a new, empty, active session can adopt KV")
            if len(block_ids) != self.engine.blocks_for(len(tokens)):
                raise InvalidRequestError(
                    f"{len(tokens)} tokens need {self.engine.blocks_for(len(tokens))} blocks, "
                    f"got {len(block_ids)}"
                )
            if sorted(self.engine.allocator.owned(live.key)) != sorted(block_ids):
                raise InvalidRequestError("the blocks are not (all) allocated to this session")
            live.tokens = list(tokens)
            live.block_table = list(block_ids)
            live.next_logits = np.asarray(next_logits, dtype=np.float32)
            now = time.time()
            self._sync_kv(live)
            row.last_active_at = now
            event = self._event(row, "adopt", now, to_state=State.ACTIVE)
            event.bytes = row.kv_bytes
            self._commit(row, event)
            return row

    # ---- generate -------------------------------------------------------------------

    def generate(
        self,
        tenant: str,
        session_id: str,
        prompt_tokens: Sequence[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int = 0,
    ) -> GenerateResult:
        """Append the prompt, decode ``max_new_tokens``; a parked session is resumed first."""
        self._refuse_if_draining()
        live = self._live(tenant, session_id)
        self._check_generate(prompt_tokens, max_new_tokens, temperature)
        with self._operation(live, "generate"):
            row = live.row
            if row.state not in (State.ACTIVE, State.PARKED, State.LOST):
                raise InvalidStateError(f"cannot generate in state {row.state}", state=row.state)
            if not prompt_tokens and live.next_logits is None:
                raise InvalidRequestError(
                    "the session has no tokens yet: give a prompt or prompt_tokens"
                )
            total = len(live.tokens) + len(prompt_tokens) + max_new_tokens
            self._check_fits(total)
            # Reserve every block this call needs before touching anything, so a full pool
            # fails here with the session unchanged.
            need = self.engine.blocks_for(total)
            held = len(live.block_table)
            self._make_room(live, need - held)
            extra = self._allocate(live, need - held)
            restored_from = resume_ms = None
            try:
                if row.state != State.ACTIVE:
                    restore_blocks = extra[: self.engine.blocks_for(len(live.tokens))]
                    extra = extra[len(restore_blocks) :]
                    result = self._bring_back(live, restore_blocks, "generate")
                    restored_from, resume_ms = result.restored_from, result.resume_ms
                live.block_table.extend(extra)
                extra = []
                self._observe_tool_return(live)
                new = self._decode(live, prompt_tokens, max_new_tokens, temperature, seed)
            finally:
                if extra:
                    self.engine.allocator.free(live.key, extra)
                self._trim_blocks(live)
            assert live.next_logits is not None
            return GenerateResult(
                row=row,
                tokens=new,
                text=self.engine.detokenize(new),
                resumed=restored_from is not None,
                restored_from=restored_from,
                resume_ms=resume_ms,
                next_logits=live.next_logits,
            )

    def _check_generate(
        self, prompt_tokens: Sequence[int], max_new_tokens: int, temperature: float
    ) -> None:
        if not 1 <= max_new_tokens <= self.max_new_tokens:
            raise LimitExceededError(
                f"max_new_tokens must be between 1 and {self.max_new_tokens}",
                max_new_tokens=max_new_tokens,
                limit=self.max_new_tokens,
            )
        if temperature < 0:
            raise InvalidRequestError("temperature must be >= 0", temperature=temperature)
        bad = [t for t in prompt_tokens if not 0 <= t < self.engine.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"token ids must be in 0..{self.engine.vocab_size - 1}", bad_tokens=bad[:10]
            )

    def _check_fits(self, total_tokens: int) -> None:
        limit = self.engine.max_seq_len
        if total_tokens > limit:
            raise LimitExceededError(
                f"session would hold {total_tokens} tokens; the model's limit is {limit} "
                "(tokens so far + prompt + max_new_tokens)",
                tokens=total_tokens,
                max_seq_len=limit,
            )
        blocks = self.engine.blocks_for(total_tokens)
        pool_blocks = self.engine.geometry.num_blocks
        if blocks > pool_blocks:
            raise LimitExceededError(
                f"session would need {blocks} KV blocks; the whole pool has {pool_blocks}",
                blocks=blocks,
                pool_blocks=pool_blocks,
            )

    def _decode(
        self,
        live: _Live,
        prompt_tokens: Sequence[int],
        max_new_tokens: int,
        temperature: float,
        seed: int,
    ) -> list[int]:
        row = live.row
        started = time.perf_counter()
        logits = live.next_logits
        if prompt_tokens:
            logits = self.engine.extend(live.block_table, len(live.tokens), prompt_tokens)
            live.tokens.extend(prompt_tokens)
        new: list[int] = []
        try:
            for _ in range(max_new_tokens):
                assert logits is not None
                token = sample(logits, temperature, seed, len(live.tokens))
                logits = self.engine.extend(live.block_table, len(live.tokens), [token])
                live.tokens.append(token)
                new.append(token)
        finally:
            live.next_logits = logits
            now = time.time()
            self._sync_kv(live)
            row.last_active_at = now
            event = self._event(row, "generate", now, to_state=State.ACTIVE)
            event.duration_ms = (time.perf_counter() - started) * 1e3
            event.detail = f"prompt={len(prompt_tokens)} new={len(new)}"
            self._commit(row, event)
            self.counters.tokens_generated += len(new)
        return new

    # ---- pause ----------------------------------------------------------------------

    def pause(
        self,
        tenant: str,
        session_id: str,
        tier: str = "auto",
        tool: str | None = None,
        expected_resume_s: float | None = None,
        reason: str = "explicit",
        wait: bool = True,
    ) -> PauseResult:
        """Copy the session's blocks to a host tier, then free them in the pool.

        The tier's slots are reserved before anything moves (507 when no tier has room);
        with ``wait=False`` the copy runs in the background and the result says PAUSING.
        """
        if reason != "drain":
            self._refuse_if_draining()
        live = self._live(tenant, session_id)
        candidates = self._tier_candidates(tier)
        if expected_resume_s is not None and expected_resume_s < 0:
            raise InvalidRequestError("expected_resume_s must be >= 0")
        self._acquire(live, "pause")
        try:
            row = live.row
            if row.state in (State.PARKED, State.LOST):
                self._release(live)
                return PauseResult(row, 0.0)  # already off the pool
            if row.state != State.ACTIVE:
                raise InvalidStateError(f"cannot pause in state {row.state}", state=row.state)
            dst, slots = self._reserve(live, candidates, len(live.block_table))
            row.state = State.PAUSING
        except BaseException:
            self._release(live)
            raise
        job = partial(self._finish_pause, live, dst, slots, tool, expected_resume_s, reason)
        return self._run(live, job, wait, PauseResult(row, None))

    def _finish_pause(
        self,
        live: _Live,
        dst: HostTier,
        slots: list[int],
        tool: str | None,
        expected_resume_s: float | None,
        reason: str,
    ) -> PauseResult:
        row = live.row
        started = time.perf_counter()
        blocks = list(live.block_table)
        try:
            self.transfer.d2h(self.engine, blocks, dst, slots)
            dst.flush()
            digest = self._checksum(dst, slots)
        except Exception as exc:
            dst.free(live.key)
            row.state = State.ACTIVE
            self._record_failure(row, "pause_failed", exc, to_tier=dst.name)
            raise _as_transfer_error("pause", exc) from exc
        self._free_blocks(live)
        live.slots = slots
        now = time.time()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        nbytes = len(blocks) * self.engine.geometry.block_nbytes
        event = self._event(row, "pause", now, from_state=State.ACTIVE, to_state=State.PARKED)
        event.to_tier, event.bytes, event.duration_ms = dst.name, nbytes, elapsed_ms
        event.reason = reason
        event.detail = f"tool={tool}" if tool else None
        row.state, row.tier, row.tier_since = State.PARKED, dst.name, now
        self._measured(nbytes, elapsed_ms)
        row.pause_count += 1
        if reason == "explicit" or row.tool is None:
            # A new wait starts here; a policy pause of a session already waiting on its
            # tool (kept at first, parked later) keeps the wait's start and estimate.
            row.paused_at, row.tool = now, tool
            row.expected_resume_at = None if expected_resume_s is None else now + expected_resume_s
        row.parked_handle = {"slots": slots}
        row.checksum = digest
        row.kv_blocks, row.kv_bytes = len(blocks), nbytes
        self._commit(row, event)
        self.counters.pauses += 1
        self.counters.bytes_parked += nbytes
        return PauseResult(row, elapsed_ms)

    def check_tier(self, name: str) -> None:
        """422 for a tier name this daemon does not know or has not enabled."""
        self._tier_candidates(name)

    def _tier_candidates(self, name: str, persistent_only: bool = False) -> list[HostTier]:
        """The tiers a pause may use, in order; 422 for an unknown or disabled tier."""
        if name not in TIER_NAMES:
            raise InvalidRequestError(f"unknown tier {name!r}; one of {', '.join(TIER_NAMES)}")
        enabled = [t for t in self.tiers.values() if not persistent_only or t.persistent]
        if name == "auto":
            return enabled
        tier = self.tiers.get(name)
        if tier is None:
            names = ", ".join(["auto", *self.tiers])
            raise InvalidRequestError(
                f"tier {name!r} is not enabled on this daemon; enabled: {names}", tier=name
            )
        return [tier]

    def _reserve(
        self, live: _Live, candidates: Sequence[HostTier], n: int
    ) -> tuple[HostTier, list[int]]:
        """Slots for ``n`` blocks in the first candidate with room, or one 507 naming all."""
        failures: dict[str, Any] = {}
        for tier in candidates:
            try:
                return tier, tier.allocate(live.key, n)
            except TierFullError as exc:
                failures[tier.name] = {
                    "free_blocks": exc.details["free_blocks"],
                    "capacity_blocks": exc.details["capacity_blocks"],
                }
        block = self.engine.geometry.block_nbytes
        names = ", ".join(failures) or "none enabled"
        raise TierFullError(
            f"no tier has room for {n} blocks ({n * block} bytes): {names}",
            needed_blocks=n,
            tiers=failures,
        )

    def _checksum(self, tier: HostTier, slots: Sequence[int]) -> str | None:
        if self.options.checksum_tiers and tier.name in self.options.checksum_tiers:
            return checksum(tier, slots)
        return None

    def keep(
        self,
        tenant: str,
        session_id: str,
        tool: str | None,
        expected_resume_s: float | None,
        why: str,
    ) -> SessionRow:
        """Record a pause the policy decided not to park: the KV stays in the pool.

        The session is marked as waiting on its tool (paused_at, tool, expected resume),
        so the tool's real duration is learned when it returns, and the idle and pressure
        rules can still park it if the wait runs long or the pool needs the room.
        """
        self._refuse_if_draining()
        live = self._live(tenant, session_id)
        with self._operation(live, "pause"):
            row = live.row
            if row.state != State.ACTIVE:
                return row  # parked or lost already: nothing to keep
            now = time.time()
            event = self._event(row, "keep", now, from_state=State.ACTIVE, to_state=State.ACTIVE)
            event.reason, event.detail = "break_even", why[:1024]
            event.bytes = row.kv_bytes
            row.paused_at, row.tool = now, tool
            row.expected_resume_at = None if expected_resume_s is None else now + expected_resume_s
            self._commit(row, event)
            return row

    def _make_room(self, live: _Live, needed: int) -> None:
        """Park idle sessions, least recently used first, until ``needed`` blocks are free.

        Never one that an operation holds (a generate in flight), never the caller. If
        parking every idle session would still not make room, park none: the caller's
        allocation then fails with 507 and the numbers.
        """
        alloc = self.engine.allocator
        if needed <= alloc.num_free:
            return
        with self._registry_lock:
            idle = [
                other
                for other in self._sessions.values()
                if other is not live
                and other.row.state == State.ACTIVE
                and other.block_table
                and not other.lock.locked()
            ]
        if alloc.num_free + sum(len(o.block_table) for o in idle) < needed:
            return
        for other in sorted(idle, key=lambda o: o.row.last_active_at):
            if alloc.num_free >= needed:
                return
            try:
                self.pause(other.row.tenant, other.row.session_id, reason="pressure")
            except AgentparkError as exc:  # busy by now, or no tier has room
                log.info("pressure: could not park %s: %s", other.key, exc.message)

    def _observe_tool_return(self, live: _Live) -> None:
        """The agent is back from its tool: record how long the tool took (learned pauses)."""
        row = live.row
        if row.tool is None or row.paused_at is None:
            return
        now = time.time()
        event = self._event(row, "tool_return", now, to_state=row.state)
        event.detail, event.duration_ms = row.tool, (now - row.paused_at) * 1e3
        row.tool, row.expected_resume_at = None, None
        self._commit(row, event)

    def _measured(self, nbytes: int, elapsed_ms: float) -> None:
        if nbytes > 0 and elapsed_ms > 0:
            self.bandwidth_bps = 0.8 * self.bandwidth_bps + 0.2 * nbytes / (elapsed_ms / 1e3)

    # ---- move -----------------------------------------------------------------------

    def move(self, tenant: str, session_id: str, tier: str, reason: str = "explicit") -> MoveResult:
        """Move a parked session's copy to another tier (drain, demotion, operator)."""
        if reason not in ("drain", "demote"):
            self._refuse_if_draining()
        live = self._live(tenant, session_id)
        if tier == "auto":
            raise InvalidRequestError("move needs a tier name, not auto")
        (dst,) = self._tier_candidates(tier)
        with self._operation(live, "move"):
            return self._move_locked(live, [dst], reason)

    def _move_locked(self, live: _Live, candidates: Sequence[HostTier], reason: str) -> MoveResult:
        row = live.row
        if row.state != State.PARKED:
            raise InvalidStateError(
                f"only a parked session can move; this one is {row.state}", state=row.state
            )
        src = self.tiers[row.tier or ""]
        if src in candidates:
            return MoveResult(row, src.name, 0.0)
        started = time.perf_counter()
        dst, slots = self._reserve(live, [t for t in candidates if t is not src], len(live.slots))
        try:
            copy_between_tiers(src, live.slots, dst, slots)
            dst.flush()
            digest = self._checksum(dst, slots)
        except Exception as exc:
            dst.free(live.key)
            self._record_failure(row, "move_failed", exc, to_tier=dst.name)
            raise _as_transfer_error("move", exc) from exc
        if row.checksum and digest and digest != row.checksum:
            # The copy we moved from was already damaged: do not keep a bad copy.
            dst.free(live.key)
            self._drop_corrupt(live, src.name)
            raise TransferError(
                f"the parked copy in {src.name} failed its checksum; the session is lost "
                "and will be recomputed on resume"
            )
        src.free(live.key)
        live.slots = slots
        now = time.time()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        event = self._event(row, "move", now, from_state=State.PARKED, to_state=State.PARKED)
        event.from_tier, event.to_tier, event.reason = src.name, dst.name, reason
        event.bytes, event.duration_ms = row.kv_bytes, elapsed_ms
        row.tier, row.parked_handle, row.tier_since = dst.name, {"slots": slots}, now
        row.checksum = digest or row.checksum
        self._commit(row, event)
        return MoveResult(row, src.name, elapsed_ms)

    # ---- resume ---------------------------------------------------------------------

    def resume(
        self, tenant: str, session_id: str, reason: str = "explicit", wait: bool = True
    ) -> ResumeResult:
        """Bring the session's KV back into the pool (copy, or recompute if it is gone)."""
        self._refuse_if_draining()
        live = self._live(tenant, session_id)
        self._acquire(live, "resume")
        try:
            row = live.row
            if row.state == State.ACTIVE:
                if reason != "prefetch":
                    self._observe_tool_return(live)
                self._release(live)
                return ResumeResult(row, "pool", 0.0)
            if row.state not in (State.PARKED, State.LOST):
                raise InvalidStateError(f"cannot resume in state {row.state}", state=row.state)
            blocks = self._allocate(live, self.engine.blocks_for(len(live.tokens)))
        except BaseException:
            self._release(live)
            raise
        from_tier = row.tier or "recompute"
        row.state = State.RESUMING if row.state == State.PARKED else State.RECOMPUTING
        job = partial(self._bring_back, live, blocks, reason)
        return self._run(live, job, wait, ResumeResult(row, from_tier, None))

    def _bring_back(self, live: _Live, blocks: list[int], reason: str) -> ResumeResult:
        """Restore a PARKED or LOST session into ``blocks`` (already allocated to it)."""
        row = live.row
        started = time.perf_counter()
        parked = row.tier is not None
        from_state = State.PARKED if parked else State.LOST
        from_tier = row.tier
        row.state = State.RESUMING if parked else State.RECOMPUTING
        try:
            if parked and not self._verify(live):
                parked = False  # the copy is damaged: recompute instead, and say why
                row.state = State.RECOMPUTING
            if parked:
                self.transfer.h2d(self.tiers[from_tier or ""], live.slots, self.engine, blocks)
                restored_from = from_tier or ""
            else:
                if live.tokens:
                    live.next_logits = self.engine.extend(blocks, 0, live.tokens)
                restored_from = "recompute"
        except Exception as exc:
            self.engine.allocator.free(live.key, blocks)
            row.state = State.PARKED if row.tier is not None else State.LOST
            self._record_failure(row, "restore_failed", exc, from_tier=from_tier)
            raise _as_transfer_error("resume", exc) from exc
        if restored_from != "recompute":
            self._free_slots(live)
        live.block_table = blocks
        now = time.time()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        kind = "recompute" if restored_from == "recompute" else "resume"
        event = self._event(row, kind, now, from_state=from_state, to_state=State.ACTIVE)
        event.from_tier, event.duration_ms, event.reason = row.tier, elapsed_ms, reason
        event.bytes = len(blocks) * self.engine.geometry.block_nbytes
        if restored_from == "recompute":
            event.detail = row.lost_reason
            self.counters.recomputes += 1
        else:
            self.counters.resumes += 1
            self.counters.bytes_restored += event.bytes
        del from_tier
        row.state, row.tier, row.parked_handle, row.lost_reason = State.ACTIVE, None, None, None
        row.checksum, row.tier_since = None, None
        row.last_active_at = now
        if restored_from != "recompute" and elapsed_ms > 0:
            self._measured(event.bytes, elapsed_ms)
        self._sync_kv(live, log_changed=restored_from == "recompute")
        self._commit(row, event)
        if reason not in ("prefetch", "generate"):
            self._observe_tool_return(live)
        return ResumeResult(row, restored_from, elapsed_ms)

    def _verify(self, live: _Live) -> bool:
        """Check the parked copy against its checksum; a mismatch marks the session LOST."""
        row = live.row
        tier = self.tiers[row.tier or ""]
        if row.checksum is None or tier.name not in self.options.checksum_tiers:
            return True
        if checksum(tier, live.slots) == row.checksum:
            return True
        self._drop_corrupt(live, tier.name)
        return False

    def _drop_corrupt(self, live: _Live, tier_name: str) -> None:
        row = live.row
        reason = f"checksum mismatch in the {tier_name} tier: parked copy is damaged"
        log.error("session %s/%s: %s; recomputing", row.tenant, row.session_id, reason)
        event = self._event(row, "corrupt", time.time(), from_state=row.state)
        event.to_state, event.from_tier, event.reason = State.LOST, tier_name, "checksum"
        event.bytes, event.detail = row.kv_bytes, reason
        self._free_slots(live)
        self._mark_lost(live, reason)
        self._commit(row, event)

    # ---- drain ----------------------------------------------------------------------

    def drain(self, deadline_s: float) -> dict[str, int]:
        """Park every session into a persistent tier (shm, then disk) within the deadline.

        New work is refused from the first moment. Sessions that cannot be made safe in
        time, or find no room, are recorded as LOST so the next start recomputes them.
        """
        self.draining = True
        deadline = time.monotonic() + deadline_s
        persistent = self._tier_candidates("auto", persistent_only=True)
        summary = {"parked": 0, "moved": 0, "already_safe": 0, "lost": 0}
        with self._registry_lock:
            sessions = sorted(
                self._sessions.values(), key=lambda lv: lv.row.last_active_at, reverse=True
            )
        for live in sessions:
            outcome = self._drain_one(live, persistent, deadline)
            summary[outcome] += 1
        log.info("drain: %s", summary)
        return summary

    def _drain_one(self, live: _Live, persistent: list[HostTier], deadline: float) -> str:
        remaining = deadline - time.monotonic()
        if not live.lock.acquire(timeout=max(remaining, 0.0)):
            return self._lose_at_drain(live, "drain deadline passed while it was busy")
        live.operation = "drain"
        row = live.row
        try:
            if row.state == State.LOST or (row.state == State.ACTIVE and not live.block_table):
                return "already_safe"
            if row.state == State.PARKED and self.tiers[row.tier or ""].persistent:
                return "already_safe"
            if time.monotonic() > deadline:
                return self._lose_at_drain(live, "drain deadline passed", locked=True)
            if not persistent:
                return self._lose_at_drain(live, "no persistent tier to drain into", True)
            try:
                if row.state == State.PARKED:
                    self._move_locked(live, persistent, "drain")
                    return "moved"
                dst, slots = self._reserve(live, persistent, len(live.block_table))
                row.state = State.PAUSING
                self._finish_pause(live, dst, slots, row.tool, None, "drain")
                return "parked"
            except AgentparkError as exc:
                return self._lose_at_drain(live, f"drain could not park it: {exc.message}", True)
        finally:
            live.operation = None
            live.lock.release()

    def _lose_at_drain(self, live: _Live, reason: str, locked: bool = False) -> str:
        """Record that this session will need a recompute after the restart."""
        row = live.row
        if row.state == State.LOST:
            return "lost"
        event = self._event(row, "lost", time.time(), from_state=row.state, to_state=State.LOST)
        event.from_tier, event.reason, event.detail = row.tier, "drain", reason
        event.bytes = row.kv_bytes
        if locked:
            self._free_blocks(live)
            self._free_slots(live)
        self._mark_lost(live, reason)
        self._commit(row, event)
        return "lost"

    # ---- host view ------------------------------------------------------------------

    def host(self) -> dict[str, Any]:
        """Pool, tier and session totals for /v1/host."""
        geometry = self.engine.geometry
        alloc = self.engine.allocator
        block = geometry.block_nbytes
        by_state: dict[str, int] = dict.fromkeys([s.value for s in State if s != "deleted"], 0)
        parked_bytes = 0
        for row in self.live_sessions():
            by_state[row.state] = by_state.get(row.state, 0) + 1
            if row.state == State.PARKED:
                parked_bytes += row.kv_bytes
        return {
            "pool": {
                "total_blocks": alloc.total,
                "used_blocks": alloc.num_used,
                "free_blocks": alloc.num_free,
                "block_size_tokens": geometry.block_size,
                "block_bytes": block,
                "total_bytes": alloc.total * block,
                "used_bytes": alloc.num_used * block,
                "free_bytes": alloc.num_free * block,
            },
            "reclaimed_bytes": parked_bytes,
            "tiers": {
                name: {
                    "persistent": tier.persistent,
                    "capacity_blocks": tier.capacity_blocks,
                    "used_blocks": tier.used_blocks,
                    "capacity_bytes": tier.capacity_blocks * block,
                    "used_bytes": tier.used_blocks * block,
                }
                for name, tier in self.tiers.items()
            },
            "sessions": by_state,
            "draining": self.draining,
            "counters": vars(self.counters).copy(),
        }

    # ---- helpers --------------------------------------------------------------------

    def _live(self, tenant: str, session_id: str) -> _Live:
        live = self._sessions.get((tenant, session_id))
        if live is None:
            row = self.get(tenant, session_id)  # raises 404 when unknown
            raise InvalidStateError(f"session {session_id!r} is {row.state}", state=row.state)
        return live

    def _acquire(self, live: _Live, name: str) -> None:
        """Take the session for one operation, or refuse: operations never queue."""
        if not live.lock.acquire(blocking=False):
            raise SessionBusyError(live.row.session_id, name, live.operation or "operation")
        live.operation = name
        if live.row.state == State.DELETED:
            self._release(live)
            raise InvalidStateError(
                f"session {live.row.session_id!r} is deleted", state=State.DELETED
            )

    def _release(self, live: _Live) -> None:
        live.operation = None
        live.lock.release()

    @contextmanager
    def _operation(self, live: _Live, name: str) -> Iterator[None]:
        self._acquire(live, name)
        try:
            yield
        finally:
            self._release(live)

    def _run(self, live: _Live, job: Callable[[], _R], wait: bool, pending: _R) -> _R:
        """Run an operation whose session is already taken; release it when done.

        ``wait=False`` hands the copy to a worker and returns ``pending`` at once; the
        session shows PAUSING/RESUMING until the worker finishes (or fails and says so in
        an event).
        """
        if wait:
            try:
                return job()
            finally:
                self._release(live)

        def in_background() -> None:
            try:
                job()
            except Exception:
                log.exception("background %s of %s failed", live.operation, live.key)
            finally:
                self._release(live)

        self._background.submit(in_background)
        return pending

    def _refuse_if_draining(self) -> None:
        if self.draining:
            raise NotReadyError("the daemon is draining for shutdown; retry on the next start")

    def _mark_lost(self, live: _Live, reason: str) -> None:
        row = live.row
        row.state, row.tier, row.lost_reason = State.LOST, None, reason
        row.kv_blocks = row.kv_bytes = 0
        row.parked_handle, row.checksum = None, None

    def _free_slots(self, live: _Live) -> None:
        tier = self.tiers.get(live.row.tier or "")
        if tier is not None:
            tier.free(live.key)
        live.slots = []

    def _record_failure(
        self,
        row: SessionRow,
        kind: str,
        exc: Exception,
        from_tier: str | None = None,
        to_tier: str | None = None,
    ) -> None:
        log.error("%s for %s/%s: %s", kind, row.tenant, row.session_id, exc)
        event = self._event(row, kind, time.time(), to_state=row.state)
        event.from_tier, event.to_tier = from_tier, to_tier
        event.detail = f"{type(exc).__name__}: {exc}"[:1024]
        self._commit(row, event)

    def _allocate(self, live: _Live, n: int) -> list[int]:
        if n <= 0:
            return []
        try:
            return self.engine.allocator.allocate(live.key, n)
        except PoolExhaustedError as exc:
            block = self.engine.geometry.block_nbytes
            raise PoolFullError(
                f"KV pool is full: needs {exc.needed} blocks ({exc.needed * block} bytes), "
                f"{exc.free} of {exc.total} free",
                needed_blocks=exc.needed,
                free_blocks=exc.free,
                total_blocks=exc.total,
                block_bytes=block,
            ) from None

    def _free_blocks(self, live: _Live) -> None:
        if live.block_table:
            self.engine.allocator.free(live.key, live.block_table)
        live.block_table = []

    def _trim_blocks(self, live: _Live) -> None:
        """Give back blocks beyond what the token log needs (after a failed or short run)."""
        keep = self.engine.blocks_for(len(live.tokens))
        surplus = live.block_table[keep:]
        if surplus:
            self.engine.allocator.free(live.key, surplus)
            live.block_table = live.block_table[:keep]
            self._sync_kv(live)

    def _sync_kv(self, live: _Live, log_changed: bool = True) -> None:
        """Mirror the live KV state into the row; the token log only when it changed
        (re-encoding a long log is a millisecond a pause or restore need not pay)."""
        row = live.row
        if log_changed:
            row.num_tokens = len(live.tokens)
            row.token_log = np.asarray(live.tokens, dtype="<i4").tobytes()
            row.next_logits = None if live.next_logits is None else live.next_logits.tobytes()
        row.kv_blocks = len(live.block_table)
        row.kv_bytes = row.kv_blocks * self.engine.geometry.block_nbytes

    def _commit(self, row: SessionRow, *events: EventRow) -> None:
        """Persist the row with the events that explain it, then tell the listeners."""
        self.store.save(row, *events)
        for event in events:
            self._notify(event)

    def _notify(self, event: EventRow) -> None:
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:
                log.exception("event listener failed on %s", event.kind)

    @staticmethod
    def _event(
        row: SessionRow,
        kind: str,
        at: float,
        from_state: str | None = None,
        to_state: str | None = None,
        detail: str | None = None,
    ) -> EventRow:
        return EventRow(
            reason="explicit",
            tenant=row.tenant,
            session_id=row.session_id,
            kind=kind,
            at=at,
            from_state=from_state,
            to_state=to_state,
            detail=detail,
        )

    def check_invariants(self) -> None:
        """Pool and tier accounting agree with the sessions (used by tests and debugging)."""
        self.engine.allocator.check_invariants()
        seen: set[int] = set()
        for live in self._sessions.values():
            owned = set(self.engine.allocator.owned(live.key))
            assert owned == set(live.block_table), f"{live.key}: allocator disagrees"
            assert not seen & owned, f"{live.key}: a block is owned twice"
            seen |= owned
            if live.row.state == State.ACTIVE and live.tokens:
                assert len(live.block_table) == self.engine.blocks_for(len(live.tokens))
            if live.row.state == State.PARKED:
                assert not live.block_table and len(live.slots) == live.row.kv_blocks
            else:
                assert not live.slots, f"{live.key}: slots held while {live.row.state}"
        assert len(seen) == self.engine.allocator.num_used, "blocks used by no session"
        parked = {n: 0 for n in self.tiers}
        for live in self._sessions.values():
            if live.row.state == State.PARKED:
                parked[live.row.tier or ""] += len(live.slots)
        for name, tier in self.tiers.items():
            assert tier.used_blocks == parked[name], f"{name}: slots used by no session"


def _decode_tokens(blob: bytes) -> list[int]:
    return np.frombuffer(blob, dtype="<i4").astype(int).tolist() if blob else []


def _decode_logits(blob: bytes | None) -> np.ndarray | None:
    return None if blob is None else np.frombuffer(blob, dtype=np.float32).copy()


def _as_transfer_error(what: str, exc: Exception) -> Exception:
    if isinstance(exc, TransferError | PoolFullError):
        return exc
    return TransferError(f"{what} failed: {exc}", operation=what)
