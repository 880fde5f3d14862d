"""The session core's state and shared steps; transitions live in pausing and restoring."""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy.exc import IntegrityError

from agentpark.blocks import PoolGeometry
from agentpark.enums import EventKind, Reason, State
from agentpark.errors import (
    AgentparkError,
    ConfigError,
    InvalidRequestError,
    NotReadyError,
    SessionExistsError,
    SessionNotFoundError,
    TransferError,
)
from agentpark.parking.events import EventListener, EventLog
from agentpark.parking.mover import Endpoint, Mover
from agentpark.parking.registry import LiveSession, Registry, holds_kv
from agentpark.parking.transitions import Transitions
from agentpark.parking.types import (
    Advisor,
    CoreOptions,
    EngineHost,
    KVHost,
)
from agentpark.snapshot import Counters, HostSnapshot, TierFigures
from agentpark.store.models import EventRow, SessionRow
from agentpark.store.repository import SessionStore
from agentpark.tally import EventTally
from agentpark.tiers.base import HostTier
from agentpark.tiers.capabilities import Replaceable

__all__ = ["BACKGROUND_REASONS", "SESSION_ID_RE", "CoreBase"]

log = logging.getLogger(__name__)

SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
# The daemon's own work: it yields a session to a user operation (agentpark.parking.registry).
BACKGROUND_REASONS = frozenset({Reason.IDLE, Reason.PRESSURE, Reason.PREFETCH, Reason.DEMOTE})
_R = TypeVar("_R")


INLINE_BYTES = 64 * 2**10
"""The most KV a pause or resume moves on the event loop (``pause_now``/``resume_now``):
its copy takes microseconds; anything larger, or a restore that must recompute, goes to a
worker thread."""


class CoreBase:
    """The core's state (registry, event log, mover) and the steps every transition shares."""

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
        self.registry = Registry(self.options.background_yield_s)
        self.events = EventLog(store, self._request_of)
        self.transitions = Transitions(self.events, self.registry.tally, mover, host)
        # The engine's blocks, where the core may claim and fill them (an in-process engine).
        self.engine: EngineHost | None = host if isinstance(host, EngineHost) else None
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

    def _request_of(self, row: SessionRow) -> str | None:
        """The engine's request the session's operation in progress serves, if any."""
        live = self.registry.find((row.tenant, row.session_id))
        return None if live is None else live.request_id

    def _count(self, event: EventRow) -> None:
        self._tally.add(event)
        self.counters.pauses = self._tally.pauses
        self.counters.resumes = self._tally.resumes
        self.counters.recomputes = self._tally.recomputes
        self.counters.bytes_parked = self._tally.bytes_parked
        self.counters.bytes_restored = self._tally.bytes_restored

    # ---- lookups ------------------------------------------------------------------------

    def live_row(self, tenant: str, session_id: str) -> SessionRow | None:
        """A live session's row, from memory (never the database); None: deleted or unknown."""
        live = self.registry.find((tenant, session_id))
        return None if live is None else live.row

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
        """A page in SQLite's order; live sessions as they are in memory (in-flight states
        such as pausing included), the others (deleted) read from SQLite."""
        ids = self.store.page_ids(tenant, state, limit, after_seq)
        live = {seq: self.registry.find((tenant, sid)) for seq, sid in ids}
        stored = self.store.rows_by_seq([seq for seq, found in live.items() if found is None])
        return [found.row if found is not None else stored[seq] for seq, found in live.items()]

    def list_events(self, tenant: str, session_id: str | None, limit: int) -> Sequence[EventRow]:
        return self.store.events(tenant, session_id, limit)

    def sessions_with_kv(self) -> list[tuple[SessionRow, bool]]:
        """Live sessions holding KV (in the pool or parked) and whether an operation holds
        each now: what the policy loop looks at, from the registry's index of them (never
        a walk of every session)."""
        return [
            (live.row, live.busy)
            for key in self.registry.tally.holders()
            if (live := self.registry.find(key)) is not None
            and holds_kv(live.row.state, live.row.kv_blocks)
        ]

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
            if (tenant, session_id) in sessions:
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
            event = self.events.event(row, EventKind.CREATE, now, to_state=State.ACTIVE)
            try:
                self.events.insert(row, event)
            except IntegrityError:  # a deleted session's row keeps its id
                raise SessionExistsError(session_id) from None
            self.registry.add(LiveSession(row, [], None))
        return row

    def delete(self, tenant: str, session_id: str) -> None:
        """Free everything the session holds; idempotent for an already deleted session."""
        live = self.registry.find((tenant, session_id))
        if live is None:
            self.get(tenant, session_id)  # 404 if it never existed; deleted: nothing to do
            return
        with self.registry.operation(live, "delete"):
            self.transitions.delete(live)  # refused: the row is back, nothing was freed
            self.registry.remove(live)

    # ---- tier files that disappear while running ---------------------------------------

    def tier_gone(self, tier: HostTier) -> str | None:
        """Why ``tier``'s file is no longer ours (removed, replaced), or None; logged once."""
        if not isinstance(tier, Replaceable):
            return None
        if tier.gone is not None:
            return tier.gone
        why = tier.missing()
        if why is None:
            return None
        tier.gone = why
        log.error(
            "%s tier: %s while the daemon runs; its parked sessions are lost (recomputed "
            "from their tokens on resume) and new pauses go to other tiers until the file "
            "is re-created",
            tier.name,
            why,
        )
        return why

    def lose_copy(self, live: LiveSession, tier_name: str, why: str) -> None:
        """The session's parked copy is gone with its tier file: LOST (the caller holds it)."""
        self.transitions.lose(
            live, Reason.TIER_FILE_MISSING, f"the {tier_name} tier file is gone: {why}"
        )

    def check_tier_files(self) -> int:
        """Notice tier files removed or replaced (policy tick); returns sessions lost.

        Each parked session of a gone tier becomes LOST (a busy one on a later tick, or
        at its next restore); once none holds a slot there, the file is made again.
        """
        lost = 0
        for tier in self.tiers.values():
            why = self.tier_gone(tier)
            if why is None:
                continue
            for live in self.registry.all():
                if live.row.state != State.PARKED or live.row.tier != tier.name:
                    continue
                try:
                    self.registry.acquire(live, "lose", background=True)
                except AgentparkError:
                    continue  # a user operation has it: its restore notices
                try:
                    if live.row.state == State.PARKED and live.row.tier == tier.name:
                        self.lose_copy(live, tier.name, why)
                        lost += 1
                finally:
                    self.registry.release(live)
            if isinstance(tier, Replaceable) and tier.used_blocks == 0:
                try:
                    tier.reopen()
                except (OSError, ConfigError) as exc:
                    log.debug("%s tier: cannot re-create the file yet: %s", tier.name, exc)
                else:
                    log.warning("%s tier: file re-created; the tier is in use again", tier.name)
        return lost

    # ---- host view ----------------------------------------------------------------------

    def snapshot(self, *, ready: bool, listen: str) -> HostSnapshot:
        """Pool, tier and session totals (``GET /v1/host`` and everything that shows it)."""
        block = self.geometry.block_nbytes
        by_state, reclaimed = self.registry.tally.figures()
        sessions = {s.value: by_state.get(s.value, 0) for s in State if s is not State.DELETED}
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
            **self._held_figures(),
        )

    def _held_figures(self) -> dict[str, Any]:
        """Tokens the active sessions hold in the engine, and how long the longest-untouched
        parked session has waited (the TTL's clock)."""
        active, parked = 0, []
        for live in self.registry.all():
            if live.row.state == State.ACTIVE:
                active += len(live.tokens)
            elif live.row.state == State.PARKED:
                parked.append(live.row.last_active_at)
        oldest = max(0.0, time.time() - min(parked)) if parked else None
        return {"active_tokens": active, "oldest_parked_s": oldest}

    # ---- shared steps -------------------------------------------------------------------

    def refuse_if_draining(self) -> None:
        if self.draining:
            raise NotReadyError("the daemon is draining for shutdown; retry on the next start")

    def endpoint(self) -> Endpoint:
        """The pool as the mover's copy source; TransferError when the engine copies its
        own blocks (an engine in another process)."""
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

        self.registry.detach(live)
        self._background.submit(in_background)
        return pending

    def free_slots(self, live: LiveSession, tier_name: str | None = None) -> None:
        """Free the session's slots in ``tier_name`` (default: the row's tier)."""
        self.transitions.free_slots(live, tier_name if tier_name is not None else live.row.tier)

    def check_invariants(self, owned: Callable[[LiveSession], list[int]] | None = None) -> None:
        """Tier accounting agrees with the sessions; with ``owned`` (the engine's record of
        each session's blocks), the block tables too. For tests and debugging."""
        parked: dict[str, set[int]] = {name: set() for name in self.tiers}
        for live in self.registry.all():
            if owned is not None:
                assert set(owned(live)) == set(live.block_table), f"{live.key}: pool disagrees"
            if live.row.state == State.ACTIVE and live.tokens and owned is not None:
                assert len(live.block_table) == self.geometry.blocks_for(len(live.tokens))
            if live.row.state == State.PARKED:
                assert not live.block_table and len(live.slots) == live.row.kv_blocks
                parked[live.row.tier or ""].update(live.slots)  # a shared slot counts once
            else:
                assert not live.slots, f"{live.key}: slots held while {live.row.state}"
        for name, tier in self.tiers.items():
            assert tier.used_blocks == len(parked[name]), f"{name}: slots used by no session"
        rows = self.live_sessions()
        by_state, parked_bytes = self.registry.tally.figures()
        for state in State:
            if state is not State.DELETED:
                counted = sum(1 for r in rows if r.state == state)
                assert by_state.get(state, 0) == counted, f"tally of {state} is off"
        assert parked_bytes == sum(r.kv_bytes for r in rows if r.state == State.PARKED)
