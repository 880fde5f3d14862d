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
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from agentpark.dma.base import Transfer
from agentpark.engine.base import EngineAdapter
from agentpark.engine.pool import PoolExhaustedError
from agentpark.engine.sampling import sample
from agentpark.errors import (
    InvalidRequestError,
    InvalidStateError,
    LimitExceededError,
    PoolFullError,
    SessionBusyError,
    SessionExistsError,
    SessionNotFoundError,
    TransferError,
)
from agentpark.store.models import EventRow, SessionRow
from agentpark.store.repository import SessionStore
from agentpark.tiers.base import HostTier

__all__ = ["GenerateResult", "Parking", "PauseResult", "ResumeResult", "State"]

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
    pause_ms: float


@dataclass(frozen=True)
class ResumeResult:
    row: SessionRow
    restored_from: str
    resume_ms: float


@dataclass
class Counters:
    """Since this daemon started; the durable history is the events table."""

    pauses: int = 0
    resumes: int = 0
    recomputes: int = 0
    bytes_parked: int = 0
    bytes_restored: int = 0
    tokens_generated: int = 0


class Parking:
    """Owns the live sessions and drives the engine, the DMA core and the tier for them."""

    def __init__(
        self,
        store: SessionStore,
        engine: EngineAdapter,
        transfer: Transfer,
        dram: HostTier,
        max_new_tokens: int,
    ) -> None:
        self.store = store
        self.engine = engine
        self.transfer = transfer
        self.dram = dram
        self.max_new_tokens = max_new_tokens
        self.counters = Counters()
        # Called with every event after it is committed (metrics, policy); must not raise.
        self.listeners: list[Callable[[EventRow], None]] = []
        self._sessions: dict[tuple[str, str], _Live] = {}
        self._registry_lock = threading.Lock()
        self._reconcile()

    # ---- start-up -------------------------------------------------------------------

    def _reconcile(self) -> None:
        """Re-attach sessions from SQLite; KV that lived in process memory is now LOST."""
        now = time.time()
        for row in self.store.live_rows():
            live = _Live(row, _decode_tokens(row.token_log), _decode_logits(row.next_logits))
            in_pool = row.state in (State.ACTIVE, State.PAUSING, State.RESUMING, State.RECOMPUTING)
            reason = None
            if row.state == State.PARKED and row.tier == "dram":
                reason = "daemon restarted: the dram tier is process memory"
            elif in_pool and row.num_tokens > 0:
                reason = "daemon restarted: the KV pool is process memory"
            elif in_pool and row.state != State.ACTIVE:
                row.state = State.ACTIVE  # no tokens, so no KV to lose
                self.store.save(row)
            if reason is not None:
                event = self._event(row, "lost", now, to_state=State.LOST, detail=reason)
                event.reason = "restart"
                event.from_state, event.from_tier = row.state, row.tier
                row.state, row.tier, row.lost_reason = State.LOST, None, reason
                row.kv_blocks = row.kv_bytes = 0
                row.parked_handle = None
                self._commit(row, event)
            self._sessions[live.key] = live
        if self._sessions:
            log.info("re-attached %d sessions", len(self._sessions))

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

    def page(
        self, tenant: str, state: str | None, limit: int, after_seq: int
    ) -> Sequence[SessionRow]:
        return self.store.page(tenant, state, limit, after_seq)

    def events(self, tenant: str, session_id: str | None, limit: int) -> Sequence[EventRow]:
        return self.store.events(tenant, session_id, limit)

    def live_sessions(self) -> list[SessionRow]:
        with self._registry_lock:
            return [live.row for live in self._sessions.values()]

    # ---- create and delete ----------------------------------------------------------

    def create(
        self, tenant: str, session_id: str | None, metadata: dict[str, Any] | None
    ) -> SessionRow:
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
            self.dram.free(live.key)
            live.slots = []
            row.state, row.tier, row.deleted_at = State.DELETED, None, now
            row.kv_blocks = row.kv_bytes = 0
            row.parked_handle = None
            self._commit(row, event)
            with self._registry_lock:
                del self._sessions[live.key]

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
            extra = self._allocate(live, need - held)
            restored_from = resume_ms = None
            try:
                if row.state != State.ACTIVE:
                    restore_blocks = extra[: self.engine.blocks_for(len(live.tokens))]
                    extra = extra[len(restore_blocks) :]
                    restored_from, resume_ms = self._bring_back(live, restore_blocks, "generate")
                live.block_table.extend(extra)
                extra = []
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
    ) -> PauseResult:
        """Copy the session's blocks to a host tier, then free them in the pool."""
        live = self._live(tenant, session_id)
        host_tier = self._tier(tier)
        if expected_resume_s is not None and expected_resume_s < 0:
            raise InvalidRequestError("expected_resume_s must be >= 0")
        with self._operation(live, "pause"):
            row = live.row
            if row.state in (State.PARKED, State.LOST):
                return PauseResult(row, 0.0)  # already off the pool
            if row.state != State.ACTIVE:
                raise InvalidStateError(f"cannot pause in state {row.state}", state=row.state)
            started = time.perf_counter()
            blocks = list(live.block_table)
            slots = host_tier.allocate(live.key, len(blocks))
            row.state = State.PAUSING
            try:
                self.transfer.d2h(self.engine, blocks, host_tier, slots)
            except Exception as exc:
                host_tier.free(live.key)
                row.state = State.ACTIVE
                raise _as_transfer_error("pause", exc) from exc
            self._free_blocks(live)
            live.slots = slots
            now = time.time()
            elapsed_ms = (time.perf_counter() - started) * 1e3
            nbytes = len(blocks) * self.engine.geometry.block_nbytes
            event = self._event(row, "pause", now, from_state=State.ACTIVE, to_state=State.PARKED)
            event.to_tier, event.bytes, event.duration_ms = host_tier.name, nbytes, elapsed_ms
            event.reason = reason
            event.detail = f"tool={tool}" if tool else None
            row.state, row.tier, row.paused_at = State.PARKED, host_tier.name, now
            row.pause_count += 1
            row.tool = tool
            row.expected_resume_at = None if expected_resume_s is None else now + expected_resume_s
            row.parked_handle = {"slots": slots}
            row.kv_blocks, row.kv_bytes = len(blocks), nbytes
            self._commit(row, event)
            self.counters.pauses += 1
            self.counters.bytes_parked += nbytes
            return PauseResult(row, elapsed_ms)

    def _tier(self, name: str) -> HostTier:
        if name not in TIER_NAMES:
            raise InvalidRequestError(f"unknown tier {name!r}; one of {', '.join(TIER_NAMES)}")
        if name not in ("auto", self.dram.name):
            raise InvalidRequestError(
                f"tier {name!r} is not enabled on this daemon; enabled: auto, {self.dram.name}",
                tier=name,
            )
        return self.dram

    # ---- resume ---------------------------------------------------------------------

    def resume(self, tenant: str, session_id: str, reason: str = "explicit") -> ResumeResult:
        """Bring the session's KV back into the pool (copy, or recompute if it is gone)."""
        live = self._live(tenant, session_id)
        with self._operation(live, "resume"):
            row = live.row
            if row.state == State.ACTIVE:
                return ResumeResult(row, "pool", 0.0)
            if row.state not in (State.PARKED, State.LOST):
                raise InvalidStateError(f"cannot resume in state {row.state}", state=row.state)
            blocks = self._allocate(live, self.engine.blocks_for(len(live.tokens)))
            restored_from, elapsed_ms = self._bring_back(live, blocks, reason)
            return ResumeResult(row, restored_from, elapsed_ms)

    def _bring_back(self, live: _Live, blocks: list[int], reason: str) -> tuple[str, float]:
        """Restore a PARKED or LOST session into ``blocks`` (already allocated to it)."""
        row = live.row
        started = time.perf_counter()
        from_state, from_tier = row.state, row.tier
        try:
            if row.state == State.PARKED:
                row.state = State.RESUMING
                self.transfer.h2d(self.dram, live.slots, self.engine, blocks)
                restored_from = row.tier or self.dram.name
            else:
                row.state = State.RECOMPUTING
                if live.tokens:
                    live.next_logits = self.engine.extend(blocks, 0, live.tokens)
                restored_from = "recompute"
        except Exception as exc:
            row.state = from_state
            self.engine.allocator.free(live.key, blocks)
            raise _as_transfer_error("resume", exc) from exc
        if restored_from != "recompute":
            self.dram.free(live.key)
            live.slots = []
        live.block_table = blocks
        now = time.time()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        kind = "recompute" if restored_from == "recompute" else "resume"
        event = self._event(row, kind, now, from_state=from_state, to_state=State.ACTIVE)
        event.from_tier, event.duration_ms, event.reason = from_tier, elapsed_ms, reason
        event.bytes = len(blocks) * self.engine.geometry.block_nbytes
        if restored_from == "recompute":
            event.detail = row.lost_reason
            self.counters.recomputes += 1
        else:
            self.counters.resumes += 1
            self.counters.bytes_restored += event.bytes
        row.state, row.tier, row.parked_handle, row.lost_reason = State.ACTIVE, None, None, None
        row.last_active_at = now
        self._sync_kv(live)
        self._commit(row, event)
        return restored_from, elapsed_ms

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
                self.dram.name: {
                    "capacity_blocks": self.dram.capacity_blocks,
                    "used_blocks": self.dram.used_blocks,
                    "capacity_bytes": self.dram.capacity_blocks * block,
                    "used_bytes": self.dram.used_blocks * block,
                }
            },
            "sessions": by_state,
            "counters": vars(self.counters).copy(),
        }

    # ---- helpers --------------------------------------------------------------------

    def _live(self, tenant: str, session_id: str) -> _Live:
        live = self._sessions.get((tenant, session_id))
        if live is None:
            row = self.get(tenant, session_id)  # raises 404 when unknown
            raise InvalidStateError(f"session {session_id!r} is {row.state}", state=row.state)
        return live

    @contextmanager
    def _operation(self, live: _Live, name: str) -> Iterator[None]:
        if not live.lock.acquire(blocking=False):
            raise SessionBusyError(live.row.session_id, name, live.operation or "operation")
        live.operation = name
        try:
            if live.row.state == State.DELETED:
                raise InvalidStateError(
                    f"session {live.row.session_id!r} is deleted", state=State.DELETED
                )
            yield
        finally:
            live.operation = None
            live.lock.release()

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

    def _sync_kv(self, live: _Live) -> None:
        row = live.row
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
        assert len(seen) == self.engine.allocator.num_used, "blocks used by no session"


def _decode_tokens(blob: bytes) -> list[int]:
    return np.frombuffer(blob, dtype="<i4").astype(int).tolist() if blob else []


def _decode_logits(blob: bytes | None) -> np.ndarray | None:
    return None if blob is None else np.frombuffer(blob, dtype=np.float32).copy()


def _as_transfer_error(what: str, exc: Exception) -> Exception:
    if isinstance(exc, TransferError | PoolFullError):
        return exc
    return TransferError(f"{what} failed: {exc}", operation=what)
