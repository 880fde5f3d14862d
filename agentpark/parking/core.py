"""The session core: one state machine for every engine.

::

                pause                 copy done
     ACTIVE ----------> PAUSING ------------------> PARKED(tier)
       ^                                              |
       |  copy done         resume / generate         |
       +---------- RESUMING <-------------------------+
       |                                              | parked copy gone or damaged
       +---------- RECOMPUTING <--------------------- LOST
     any state --delete--> DELETED (blocks and tier slots freed, row kept)

The core knows sessions, blocks, tiers and events, not who runs the model: that is the
:class:`KVHost` it is given, an engine driver (agentpark.parking.inprocess for the
reference engine, agentpark.parking.external for an engine in another process). Nothing
is freed before its copy is complete, and a failed step leaves the session where it was.
Every session keeps its token log, so KV that is gone is rebuilt: slower, never lost.

Everything here is synchronous and thread-safe; the API calls it from worker threads.
The KV invariant: a session with KV holds exactly ``blocks_for(len(tokens))`` blocks
covering every token of its log.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from agentpark.blocks import PoolGeometry
from agentpark.enums import EventKind, Reason, RestoredFrom, State, TierChoice
from agentpark.errors import (
    InvalidRequestError,
    InvalidStateError,
    NotReadyError,
    PoolFullError,
    SessionExistsError,
    SessionNotFoundError,
    TransferError,
)
from agentpark.parking.events import EventListener, EventLog
from agentpark.parking.mover import Endpoint, Mover
from agentpark.parking.registry import LiveSession, Registry
from agentpark.snapshot import Counters, HostSnapshot, PoolFigures, TierFigures
from agentpark.store.models import EventRow, SessionRow
from agentpark.store.repository import SessionStore
from agentpark.tally import EventTally
from agentpark.tiers.base import HostTier

__all__ = [
    "CoreOptions",
    "KVHost",
    "MoveResult",
    "PauseAdvice",
    "PauseOrder",
    "PauseResult",
    "ResumeResult",
    "SessionCore",
]

log = logging.getLogger(__name__)

SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_R = TypeVar("_R")


class KVHost(Protocol):
    """What the core needs from whoever runs the model: an engine driver."""

    geometry: PoolGeometry
    model_uid: str
    backend_name: str  # the DMA backend that moves its bytes, for /v1/host

    def endpoint(self) -> Endpoint | None:
        """The pool as the mover's copy source and destination (None: the engine copies)."""
        ...

    def claim(self, live: LiveSession, n: int) -> list[int]:
        """``n`` pool blocks for a restore of ``live`` (PoolFullError when there are none)."""
        ...

    def release(self, live: LiveSession, blocks: Sequence[int]) -> None:
        """The blocks go back to the engine (after a park, a delete, a failed restore)."""
        ...

    def recompute(self, live: LiveSession, blocks: Sequence[int]) -> None:
        """Rebuild the KV of ``live.tokens`` into ``blocks`` (and ``live.next_logits``)."""
        ...

    def pool_figures(self) -> PoolFigures: ...


@dataclass(frozen=True)
class CoreOptions:
    checksum_tiers: frozenset[str] = frozenset({"shm", "disk"})
    background_workers: int = 4


@dataclass(frozen=True)
class PauseOrder:
    """A pause as a caller asks for it."""

    tier: str = TierChoice.AUTO
    tool: str | None = None
    expected_resume_s: float | None = None
    force: bool = False  # park even when the advisor would keep it
    reason: str = Reason.EXPLICIT


@dataclass(frozen=True)
class PauseAdvice:
    """The advisor's answer: park or keep, why, and the pause length it assumed."""

    park: bool
    why: str
    expected_s: float | None


Advisor = Callable[[int, str | None, float | None], PauseAdvice]
"""(kv_bytes, tool, expected_resume_s given) -> advice; the policy service is one."""


@dataclass(frozen=True)
class PauseResult:
    row: SessionRow
    decision: str  # parked | kept
    why: str
    expected_s: float | None
    pause_ms: float | None  # None: still in flight (wait=False)


@dataclass(frozen=True)
class ResumeResult:
    row: SessionRow
    restored_from: RestoredFrom
    resume_ms: float | None  # None: still in flight (wait=False)


@dataclass(frozen=True)
class MoveResult:
    row: SessionRow
    from_tier: str
    move_ms: float


class SessionCore:
    """Owns the live sessions; drives the mover and the event log for them."""

    def __init__(
        self,
        store: SessionStore,
        host: KVHost,
        mover: Mover,
        options: CoreOptions | None = None,
    ) -> None:
        self.store = store
        self.host = host
        self.mover = mover
        self.options = options or CoreOptions()
        self.registry = Registry()
        self.events = EventLog(store)
        self.counters = Counters()
        self.draining = False
        self.advisor: Advisor | None = None
        self._tally = EventTally()
        self.events.add_listener(self._count)
        self._background = ThreadPoolExecutor(
            self.options.background_workers, thread_name_prefix="agentpark-copy"
        )

    @property
    def tiers(self) -> dict[str, HostTier]:
        return self.mover.tiers

    @property
    def bandwidth_bps(self) -> float:
        return self.mover.bandwidth_bps

    @property
    def geometry(self) -> PoolGeometry:
        return self.host.geometry

    def add_listener(self, listener: EventListener) -> None:
        """Call ``listener`` with every committed event, starting with those of start-up."""
        self.events.add_listener(listener)

    def close(self) -> None:
        """Wait for background copies (wait=false pauses and resumes) to finish."""
        self._background.shutdown(wait=True)

    def _count(self, event: EventRow) -> None:
        self._tally.add(event)
        self.counters.pauses = self._tally.pauses
        self.counters.resumes = self._tally.resumes
        self.counters.recomputes = self._tally.recomputes
        self.counters.bytes_parked = self._tally.bytes_parked
        self.counters.bytes_restored = self._tally.bytes_restored

    # ---- lookups ------------------------------------------------------------------------

    def get(self, tenant: str, session_id: str) -> SessionRow:
        """A session by id, deleted ones included (their rows are history)."""
        live = self.registry.find((tenant, session_id))
        if live is not None:
            return live.row
        row = self.store.get(tenant, session_id)
        if row is None:
            raise SessionNotFoundError(session_id)
        return row

    def live(self, tenant: str, session_id: str) -> LiveSession:
        """The live session; 404 unknown, 409 deleted."""
        key = (tenant, session_id)
        found = self.registry.find(key)
        return found or self.registry.require(key, self.store.get(tenant, session_id))

    def page(self, tenant: str, state: str | None, limit: int, after_seq: int) -> list[SessionRow]:
        """A page from SQLite, with in-flight states (pausing, resuming) from memory."""
        rows = self.store.page(tenant, state, limit, after_seq)
        return [self._live_row(r) for r in rows]

    def _live_row(self, row: SessionRow) -> SessionRow:
        live = self.registry.find((row.tenant, row.session_id))
        return live.row if live is not None else row

    def list_events(self, tenant: str, session_id: str | None, limit: int) -> Sequence[EventRow]:
        return self.store.events(tenant, session_id, limit)

    def sessions(self) -> list[tuple[SessionRow, bool]]:
        """Every live session and whether an operation holds it now (for the policy loop)."""
        return [(live.row, live.busy) for live in self.registry.all()]

    def live_sessions(self) -> list[SessionRow]:
        return [live.row for live in self.registry.all()]

    # ---- create and delete --------------------------------------------------------------

    def create(
        self, tenant: str, session_id: str | None, metadata: dict[str, Any] | None
    ) -> SessionRow:
        self.refuse_if_draining()
        session_id = session_id or uuid.uuid4().hex
        if not SESSION_ID_RE.match(session_id):
            raise InvalidRequestError(
                "session_id must be 1-128 characters of letters, digits and ._:- "
                "starting with a letter or digit",
                session_id=session_id,
            )
        now = time.time()
        with self.registry.adding() as sessions:
            if (tenant, session_id) in sessions or self.store.get(tenant, session_id):
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
            self.events.insert(
                row, self.events.event(row, EventKind.CREATE, now, to_state=State.ACTIVE)
            )
            sessions[(tenant, session_id)] = LiveSession(row, [], None)
        return row

    def delete(self, tenant: str, session_id: str) -> None:
        """Free everything the session holds; idempotent for an already deleted session."""
        live = self.registry.find((tenant, session_id))
        if live is None:
            self.get(tenant, session_id)  # 404 if it never existed; deleted: nothing to do
            return
        with self.registry.operation(live, "delete"):
            row = live.row
            now = time.time()
            event = self.events.event(
                row, EventKind.DELETE, now, to_state=State.DELETED, nbytes=row.kv_bytes
            )
            self.release_blocks(live)
            self.free_slots(live)
            row.state, row.tier, row.deleted_at = State.DELETED, None, now
            row.kv_blocks = row.kv_bytes = 0
            row.parked_handle = None
            self.events.commit(row, event)
            self.registry.remove(live)

    # ---- pause --------------------------------------------------------------------------

    def check_tier(self, choice: str) -> None:
        """422 for a tier name this daemon does not know or has not enabled."""
        self.mover.candidates(choice)

    def pause(
        self,
        tenant: str,
        session_id: str,
        order: PauseOrder = PauseOrder(),  # noqa: B008 (frozen, so one default is safe)
        wait: bool = True,
    ) -> PauseResult:
        """Park the session's blocks in a host tier, or keep them when the pause is short.

        The decision is the advisor's (break-even, learned tool pauses), taken under the
        session's lock; ``force`` and background reasons (idle, pressure) always park.
        The tier's slots are reserved before anything moves (507 when no tier has room);
        with ``wait=False`` the copy runs in the background and the result says PAUSING.
        """
        if order.reason != Reason.DRAIN:
            self.refuse_if_draining()
        candidates = self.mover.candidates(order.tier)
        live = self.live(tenant, session_id)
        self.registry.acquire(live, "pause")
        try:
            row = live.row
            if row.state in (State.PARKED, State.LOST):
                self.registry.release(live)
                return PauseResult(row, "parked", "already off the pool", None, 0.0)
            if row.state != State.ACTIVE:
                raise InvalidStateError(f"cannot pause in state {row.state}", state=row.state)
            advice = self._advise(row, order)
            if not advice.park:
                self.keep_locked(live, order.tool, advice.expected_s, advice.why)
                self.registry.release(live)
                return PauseResult(row, "kept", advice.why, advice.expected_s, 0.0)
            dst, slots = self.mover.reserve(live.key, candidates, len(live.block_table))
            row.state = State.PAUSING
        except BaseException:
            if live.operation is not None:
                self.registry.release(live)
            raise

        def job() -> PauseResult:
            ms = self.park_locked(live, dst, slots, order.tool, advice.expected_s, order.reason)
            return PauseResult(row, "parked", advice.why, advice.expected_s, ms)

        return self._run(
            live, job, wait, PauseResult(row, "parked", advice.why, advice.expected_s, None)
        )

    def _advise(self, row: SessionRow, order: PauseOrder) -> PauseAdvice:
        if order.force:
            return PauseAdvice(True, "forced by the caller", order.expected_resume_s)
        if order.reason != Reason.EXPLICIT:
            return PauseAdvice(True, f"policy: {order.reason}", order.expected_resume_s)
        if self.advisor is None:
            return PauseAdvice(True, "no policy: every pause parks", order.expected_resume_s)
        return self.advisor(row.kv_bytes, order.tool, order.expected_resume_s)

    def park_locked(
        self,
        live: LiveSession,
        dst: HostTier,
        slots: list[int],
        tool: str | None,
        expected_resume_s: float | None,
        reason: str,
    ) -> float:
        """Copy the session's blocks into ``slots`` of ``dst`` and commit PARKED.

        The caller holds the session and reserved the slots; on failure they are freed
        and the session is ACTIVE again, its blocks untouched. Returns the milliseconds.
        """
        row = live.row
        started = time.perf_counter()
        blocks = list(live.block_table)
        try:
            source = self._endpoint()
            self.mover.copy(source, blocks, dst, slots)
            digest = self.mover.land(dst, slots)
        except Exception as exc:
            dst.free(live.key)
            row.state = State.ACTIVE
            self.events.failure(row, EventKind.PAUSE_FAILED, exc, at=time.time(), to_tier=dst.name)
            raise as_transfer_error("pause", exc) from exc
        self.release_blocks(live)
        self.commit_parked(
            live, dst, slots, digest, len(blocks), started, tool, expected_resume_s, reason
        )
        return (time.perf_counter() - started) * 1e3

    def commit_parked(
        self,
        live: LiveSession,
        dst: HostTier,
        slots: list[int],
        digest: str | None,
        num_blocks: int,
        started: float,
        tool: str | None,
        expected_resume_s: float | None,
        reason: str,
    ) -> None:
        """The copy is in ``slots`` of ``dst`` and the pool's blocks are gone: say PARKED."""
        row = live.row
        live.slots = slots
        now = time.time()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        nbytes = num_blocks * self.geometry.block_nbytes
        event = self.events.event(
            row,
            EventKind.PAUSE,
            now,
            from_state=State.ACTIVE,
            to_state=State.PARKED,
            to_tier=dst.name,
            reason=reason,
            nbytes=nbytes,
            duration_ms=elapsed_ms,
            detail=f"tool={tool}" if tool else None,
        )
        row.state, row.tier, row.tier_since = State.PARKED, dst.name, now
        self.mover.measured(nbytes, elapsed_ms)
        row.pause_count += 1
        if reason == Reason.EXPLICIT or row.tool is None:
            # A new wait starts here; a policy pause of a session already waiting on its
            # tool (kept at first, parked later) keeps the wait's start and estimate.
            row.paused_at, row.tool = now, tool
            row.expected_resume_at = None if expected_resume_s is None else now + expected_resume_s
        row.parked_handle = {"slots": slots}
        row.checksum = digest
        row.kv_blocks, row.kv_bytes = num_blocks, nbytes
        self.events.commit(row, event)

    def keep_locked(
        self, live: LiveSession, tool: str | None, expected_resume_s: float | None, why: str
    ) -> None:
        """Record a pause the advisor decided not to park: the KV stays in the pool.

        The session is marked as waiting on its tool (paused_at, tool, expected resume),
        so the tool's real duration is learned when it returns, and the idle and pressure
        rules can still park it if the wait runs long or the pool needs the room.
        """
        row = live.row
        now = time.time()
        event = self.events.event(
            row,
            EventKind.KEEP,
            now,
            from_state=State.ACTIVE,
            to_state=State.ACTIVE,
            reason=Reason.BREAK_EVEN,
            nbytes=row.kv_bytes,
            detail=why,
        )
        row.paused_at, row.tool = now, tool
        row.expected_resume_at = None if expected_resume_s is None else now + expected_resume_s
        self.events.commit(row, event)

    # ---- resume -------------------------------------------------------------------------

    def resume(
        self, tenant: str, session_id: str, reason: str = Reason.EXPLICIT, wait: bool = True
    ) -> ResumeResult:
        """Bring the session's KV back into the pool (copy, or recompute if it is gone)."""
        self.refuse_if_draining()
        live = self.live(tenant, session_id)
        self.registry.acquire(live, "resume")
        try:
            row = live.row
            if row.state == State.ACTIVE:
                if reason != Reason.PREFETCH:
                    self.observe_tool_return(live)
                self.registry.release(live)
                return ResumeResult(row, RestoredFrom.POOL, 0.0)
            if row.state not in (State.PARKED, State.LOST):
                raise InvalidStateError(f"cannot resume in state {row.state}", state=row.state)
            blocks = self.host.claim(live, self.geometry.blocks_for(len(live.tokens)))
        except BaseException:
            if live.operation is not None:
                self.registry.release(live)
            raise
        source = RestoredFrom(row.tier) if row.tier else RestoredFrom.RECOMPUTE
        row.state = State.RESUMING if row.state == State.PARKED else State.RECOMPUTING

        def job() -> ResumeResult:
            return self.restore_locked(live, blocks, reason)

        return self._run(live, job, wait, ResumeResult(row, source, None))

    def restore_locked(
        self, live: LiveSession, blocks: list[int], reason: str, keep_tokens: int | None = None
    ) -> ResumeResult:
        """Restore a PARKED or LOST session into ``blocks`` (already claimed for it).

        ``keep_tokens``: restore only that prefix of the token log (whole blocks, one per
        entry of ``blocks``); the session then holds just those tokens.
        """
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
                slots = live.slots[: len(blocks)]
                self.mover.copy(self.tiers[from_tier or ""], slots, self._endpoint(), blocks)
                restored_from = RestoredFrom(from_tier or "")
            else:
                if live.tokens:
                    self.host.recompute(live, blocks)
                restored_from = RestoredFrom.RECOMPUTE
        except Exception as exc:
            self.host.release(live, blocks)
            row.state = State.PARKED if row.tier is not None else State.LOST
            self.events.failure(
                row, EventKind.RESTORE_FAILED, exc, at=time.time(), from_tier=from_tier
            )
            raise as_transfer_error("resume", exc) from exc
        recomputed = restored_from == RestoredFrom.RECOMPUTE
        if not recomputed:
            self.free_slots(live)
        live.block_table = blocks
        if keep_tokens is not None:
            live.tokens = live.tokens[:keep_tokens]
        now = time.time()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        event = self.events.event(
            row,
            EventKind.RECOMPUTE if recomputed else EventKind.RESUME,
            now,
            from_state=from_state,
            to_state=State.ACTIVE,
            from_tier=row.tier,
            reason=reason,
            nbytes=len(blocks) * self.geometry.block_nbytes,
            duration_ms=elapsed_ms,
            detail=row.lost_reason if recomputed else None,
        )
        row.state, row.tier, row.parked_handle, row.lost_reason = State.ACTIVE, None, None, None
        row.checksum, row.tier_since = None, None
        row.last_active_at = now
        if not recomputed:
            self.mover.measured(event.bytes or 0, elapsed_ms)
        self.sync_kv(live, log_changed=recomputed or keep_tokens is not None)
        self.events.commit(row, event)
        if reason not in (Reason.PREFETCH, Reason.GENERATE):
            self.observe_tool_return(live)
        return ResumeResult(row, restored_from, elapsed_ms)

    def _verify(self, live: LiveSession) -> bool:
        """Check the parked copy against its checksum; a mismatch marks the session LOST."""
        row = live.row
        tier = self.tiers[row.tier or ""]
        if self.mover.intact(tier, live.slots, row.checksum):
            return True
        self.drop_corrupt(live, tier.name)
        return False

    def drop_corrupt(self, live: LiveSession, tier_name: str) -> None:
        row = live.row
        reason = f"checksum mismatch in the {tier_name} tier: parked copy is damaged"
        log.error("session %s/%s: %s; recomputing", row.tenant, row.session_id, reason)
        event = self.events.event(
            row,
            EventKind.CORRUPT,
            time.time(),
            from_state=row.state,
            to_state=State.LOST,
            from_tier=tier_name,
            reason=Reason.CHECKSUM,
            nbytes=row.kv_bytes,
            detail=reason,
        )
        self.free_slots(live)
        self.mark_lost(live, reason)
        self.events.commit(row, event)

    def observe_tool_return(self, live: LiveSession) -> None:
        """The agent is back from its tool: record how long the tool took (learned pauses)."""
        row = live.row
        if row.tool is None or row.paused_at is None:
            return
        now = time.time()
        event = self.events.event(
            row,
            EventKind.TOOL_RETURN,
            now,
            to_state=row.state,
            detail=row.tool,
            duration_ms=(now - row.paused_at) * 1e3,
        )
        row.tool, row.expected_resume_at = None, None
        self.events.commit(row, event)

    # ---- move ---------------------------------------------------------------------------

    def move(
        self, tenant: str, session_id: str, tier: str, reason: str = Reason.EXPLICIT
    ) -> MoveResult:
        """Move a parked session's copy to another tier (drain, demotion, operator)."""
        if reason not in (Reason.DRAIN, Reason.DEMOTE):
            self.refuse_if_draining()
        live = self.live(tenant, session_id)
        if tier == TierChoice.AUTO:
            raise InvalidRequestError("move needs a tier name, not auto")
        (dst,) = self.mover.candidates(tier)
        with self.registry.operation(live, "move"):
            return self.move_locked(live, [dst], reason)

    def move_locked(
        self, live: LiveSession, candidates: Sequence[HostTier], reason: str
    ) -> MoveResult:
        row = live.row
        if row.state != State.PARKED:
            raise InvalidStateError(
                f"only a parked session can move; this one is {row.state}", state=row.state
            )
        src = self.tiers[row.tier or ""]
        if src in candidates:
            return MoveResult(row, src.name, 0.0)
        started = time.perf_counter()
        others = [t for t in candidates if t is not src]
        dst, slots = self.mover.reserve(live.key, others, len(live.slots))
        try:
            self.mover.copy(src, live.slots, dst, slots)
            digest = self.mover.land(dst, slots)
        except Exception as exc:
            dst.free(live.key)
            self.events.failure(row, EventKind.MOVE_FAILED, exc, at=time.time(), to_tier=dst.name)
            raise as_transfer_error("move", exc) from exc
        if row.checksum and digest and digest != row.checksum:
            # The copy we moved from was already damaged: do not keep a bad copy.
            dst.free(live.key)
            self.drop_corrupt(live, src.name)
            raise TransferError(
                f"the parked copy in {src.name} failed its checksum; the session is lost "
                "and will be recomputed on resume"
            )
        src.free(live.key)
        live.slots = slots
        now = time.time()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        event = self.events.event(
            row,
            EventKind.MOVE,
            now,
            from_state=State.PARKED,
            to_state=State.PARKED,
            from_tier=src.name,
            to_tier=dst.name,
            reason=reason,
            nbytes=row.kv_bytes,
            duration_ms=elapsed_ms,
        )
        row.tier, row.parked_handle, row.tier_since = dst.name, {"slots": slots}, now
        row.checksum = digest or row.checksum
        self.events.commit(row, event)
        return MoveResult(row, src.name, elapsed_ms)

    # ---- host view ----------------------------------------------------------------------

    def snapshot(self, *, ready: bool, listen: str) -> HostSnapshot:
        """Pool, tier and session totals (``GET /v1/host`` and everything that shows it)."""
        block = self.geometry.block_nbytes
        sessions = {s.value: 0 for s in State if s is not State.DELETED}
        reclaimed = 0
        for row in self.live_sessions():
            sessions[row.state] = sessions.get(row.state, 0) + 1
            if row.state == State.PARKED:
                reclaimed += row.kv_bytes
        tiers = {
            name: TierFigures(
                persistent=tier.persistent,
                capacity_blocks=tier.capacity_blocks,
                used_blocks=tier.used_blocks,
                capacity_bytes=tier.capacity_blocks * block,
                used_bytes=tier.used_blocks * block,
            )
            for name, tier in self.tiers.items()
        }
        return HostSnapshot(
            ready=ready,
            model_uid=self.host.model_uid,
            dma_backend=self.host.backend_name,
            listen=listen,
            pool=self.host.pool_figures(),
            reclaimed_bytes=reclaimed,
            tiers=tiers,
            sessions=sessions,
            draining=self.draining,
            counters=self.counters.model_copy(),
        )

    # ---- shared steps -------------------------------------------------------------------

    def refuse_if_draining(self) -> None:
        if self.draining:
            raise NotReadyError("the daemon is draining for shutdown; retry on the next start")

    def _endpoint(self) -> Endpoint:
        endpoint = self.host.endpoint()
        if endpoint is None:
            raise TransferError("this engine copies its own blocks; the core cannot reach them")
        return endpoint

    def _run(self, live: LiveSession, job: Callable[[], _R], wait: bool, pending: _R) -> _R:
        """Run an operation whose session is already taken; release it when done.

        ``wait=False`` hands the copy to a worker and returns ``pending`` at once; the
        session shows PAUSING/RESUMING until the worker finishes (or fails and says so in
        an event).
        """
        if wait:
            try:
                return job()
            finally:
                self.registry.release(live)

        def in_background() -> None:
            try:
                job()
            except Exception:
                log.exception("background %s of %s failed", live.operation, live.key)
            finally:
                self.registry.release(live)

        self._background.submit(in_background)
        return pending

    def mark_lost(self, live: LiveSession, reason: str) -> None:
        row = live.row
        row.state, row.tier, row.lost_reason = State.LOST, None, reason
        row.kv_blocks = row.kv_bytes = 0
        row.parked_handle, row.checksum = None, None

    def free_slots(self, live: LiveSession) -> None:
        tier = self.tiers.get(live.row.tier or "")
        if tier is not None:
            tier.free(live.key)
        live.slots = []

    def release_blocks(self, live: LiveSession) -> None:
        if live.block_table:
            self.host.release(live, live.block_table)
        live.block_table = []

    def sync_kv(self, live: LiveSession, log_changed: bool = True) -> None:
        """Mirror the live KV state into the row; the token log only when it changed
        (re-encoding a long log is a millisecond a pause or restore need not pay)."""
        row = live.row
        if log_changed:
            row.num_tokens = len(live.tokens)
            row.token_log = np.asarray(live.tokens, dtype="<i4").tobytes()
            row.next_logits = None if live.next_logits is None else live.next_logits.tobytes()
        row.kv_blocks = len(live.block_table)
        row.kv_bytes = row.kv_blocks * self.geometry.block_nbytes

    def check_invariants(self, owned: Callable[[LiveSession], list[int]] | None = None) -> None:
        """Tier accounting agrees with the sessions; with ``owned`` (the engine's record of
        each session's blocks), the block tables too. For tests and debugging."""
        parked = dict.fromkeys(self.tiers, 0)
        for live in self.registry.all():
            if owned is not None:
                assert set(owned(live)) == set(live.block_table), f"{live.key}: pool disagrees"
            if live.row.state == State.ACTIVE and live.tokens and owned is not None:
                assert len(live.block_table) == self.geometry.blocks_for(len(live.tokens))
            if live.row.state == State.PARKED:
                assert not live.block_table and len(live.slots) == live.row.kv_blocks
                parked[live.row.tier or ""] += len(live.slots)
            else:
                assert not live.slots, f"{live.key}: slots held while {live.row.state}"
        for name, tier in self.tiers.items():
            assert tier.used_blocks == parked[name], f"{name}: slots used by no session"


def as_transfer_error(what: str, exc: Exception) -> Exception:
    if isinstance(exc, TransferError | PoolFullError):
        return exc
    return TransferError(f"{what} failed: {exc}", operation=what)
