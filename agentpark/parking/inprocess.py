"""The in-process driver: the session core driven by an engine that runs in this daemon.

The reference engine (or any :class:`~agentpark.engine.base.EngineAdapter`) owns the pool
and its block allocator; this driver allocates a session's blocks, runs generate (prefill
and decode), and recomputes a lost session from its token log.

A generate or resume that needs blocks goes through admission (agentpark.parking.admission):
it parks idle sessions (least recently used first) to make room, and when none can be
parked it waits in a FIFO queue for blocks instead of failing; 507 ``pool_full`` only
after ``admission_timeout_s``, with Retry-After. A generate that must wait while holding
blocks of its own parks itself first, so that waiters never hold the blocks the head of
the queue needs (it is restored, as a parked session's generate is, once admitted).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from agentpark.blocks import PoolExhaustedError
from agentpark.dma.base import Transfer
from agentpark.engine.base import EngineAdapter
from agentpark.engine.sampling import sample
from agentpark.enums import EventKind, Reason, RestoredFrom, State, TierChoice
from agentpark.errors import (
    AgentparkError,
    InvalidRequestError,
    InvalidStateError,
    StorageUnavailableError,
    TierFullError,
)
from agentpark.parking.admission import Admission
from agentpark.parking.core import CoreOptions, PauseOrder, SessionCore
from agentpark.parking.limits import check_fits, check_generate, pool_full
from agentpark.parking.mover import EnginePool, Mover
from agentpark.parking.recovery import recover
from agentpark.parking.registry import LiveSession
from agentpark.snapshot import PoolFigures
from agentpark.store.models import SessionRow
from agentpark.store.repository import SessionStore
from agentpark.tiers.base import HostTier
from agentpark.views import SessionView, least_recently_used

__all__ = ["GenerateResult", "InProcessDriver", "in_process_core"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerateResult:
    row: SessionRow
    tokens: list[int]
    text: str
    resumed: bool
    restored_from: RestoredFrom | None
    resume_ms: float | None
    next_logits: np.ndarray


class InProcessDriver:
    """The core's KV host for an engine in this process, and the generate path."""

    def __init__(self, engine: EngineAdapter, transfer: Transfer, max_new_tokens: int) -> None:
        self.engine = engine
        self.transfer = transfer
        self.max_new_tokens = max_new_tokens
        self.geometry = engine.geometry
        self.model_uid = engine.model_uid
        self.backend_name = transfer.name
        self._pool = EnginePool(engine)
        self.admission = Admission(lambda: self.engine.allocator.num_free)
        self.core: SessionCore  # set by in_process_core

    # ---- KVHost -------------------------------------------------------------------------

    def endpoint(self) -> EnginePool:
        return self._pool

    def claim(self, live: LiveSession, n: int) -> list[int]:
        """``n`` blocks for a restore of ``live``: admitted in turn, room made, or waited for."""
        return self._admit(live, n, None)

    def claim_now(self, live: LiveSession, n: int) -> list[int] | None:
        return self.admission.now(n, lambda k: self._allocate(live, k))

    @contextmanager
    def engine_lock_now(self) -> Iterator[bool]:
        got = self.engine.lock.acquire(blocking=False)
        try:
            yield got
        finally:
            if got:
                self.engine.lock.release()

    def _allocate(self, live: LiveSession, n: int) -> list[int]:
        try:
            return self.engine.allocator.allocate(live.key, n)
        except PoolExhaustedError as exc:
            raise pool_full(self.geometry, exc.needed, exc.free, exc.total) from None

    def _admit(self, live: LiveSession, n: int, total_tokens: int | None) -> list[int]:
        """Blocks for ``live`` (held by the caller), in FIFO order with every other request.

        ``total_tokens``: a generate's size once done; given, the session may park itself
        while it waits (it then needs blocks for all of it, and is restored into them).
        The daemon's own work (``live`` held in the background) never waits.
        """
        if n <= 0:
            return []
        alloc = self.engine.allocator
        if live.lock.background:
            blocks = self.admission.now(n, lambda k: self._allocate(live, k))
            if blocks is None:
                raise pool_full(self.geometry, n, alloc.num_free, alloc.total)
            return blocks
        timeout = self.core.options.admission_timeout_s
        deadline = time.monotonic() + timeout
        ticket = self.admission.enter(n)
        try:
            while True:
                self.core.refuse_if_draining()
                if self.admission.is_head(ticket):
                    blocks = self.admission.take(ticket, lambda k: self._allocate(live, k))
                    if blocks is None:
                        self._make_room(live, ticket.needed)
                        blocks = self.admission.take(ticket, lambda k: self._allocate(live, k))
                    if blocks is not None:
                        return blocks
                if total_tokens is not None and self._park_self(live):
                    ticket.needed = self.geometry.blocks_for(total_tokens)
                    continue
                if not self.admission.wait(ticket, deadline):
                    raise pool_full(
                        self.geometry, ticket.needed, alloc.num_free, alloc.total, timeout
                    )
        finally:
            self.admission.leave(ticket)

    def _park_self(self, live: LiveSession) -> bool:
        """Park the caller's own session (it must wait for blocks): its blocks go to the
        requests ahead of it. False when it holds none or no tier has room."""
        row = live.row
        if row.state != State.ACTIVE or not live.block_table:
            return False
        core = self.core
        candidates = core.mover.candidates(TierChoice.AUTO)
        try:
            dst, slots = core.transitions.begin_park(live, candidates)
        except TierFullError:
            return False
        core.transitions.park_into(live, self._pool, dst, slots, row.tool, None, Reason.PRESSURE)
        return True

    def wake(self) -> None:
        """Wake every waiter (drain: they give up with 503)."""
        self.admission.notify()

    def release(self, live: LiveSession, blocks: Sequence[int]) -> None:
        if blocks:
            self.engine.allocator.free(live.key, blocks)
            self.admission.notify()

    def recompute(self, live: LiveSession, blocks: Sequence[int]) -> None:
        live.next_logits = self.engine.extend(blocks, 0, live.tokens)

    def pool_figures(self) -> PoolFigures:
        alloc, block = self.engine.allocator, self.geometry.block_nbytes
        used, free = alloc.num_used, alloc.num_free
        return PoolFigures(
            total_blocks=alloc.total,
            used_blocks=used,
            free_blocks=free,
            block_size_tokens=self.geometry.block_size,
            block_bytes=block,
            total_bytes=alloc.total * block,
            used_bytes=used * block,
            free_bytes=free * block,
        )

    # ---- generate -----------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        return self.engine.tokenize(text)

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
        core = self.core
        core.refuse_if_draining()
        live = core.live(tenant, session_id)
        check_generate(self.engine, prompt_tokens, max_new_tokens, self.max_new_tokens)
        with core.registry.operation(live, "generate"):
            row = live.row
            if row.state not in (State.ACTIVE, State.PARKED, State.LOST):
                raise InvalidStateError(f"cannot generate in state {row.state}", state=row.state)
            if not prompt_tokens and live.next_logits is None:
                raise InvalidStateError(  # the session's state, not the body: 409
                    "the session has no tokens yet: give a prompt or prompt_tokens"
                )
            total = len(live.tokens) + len(prompt_tokens) + max_new_tokens
            check_fits(self.engine, total)
            # Reserve every block this call needs before touching anything, so a full pool
            # fails here with the session unchanged (or parked, if it had to wait).
            need = self.geometry.blocks_for(total) - len(live.block_table)
            extra = self._admit(live, need, total)
            restored_from = resume_ms = None
            try:
                if row.state != State.ACTIVE:
                    restore = extra[: self.geometry.blocks_for(len(live.tokens))]
                    extra = extra[len(restore) :]
                    core.transitions.begin_restore(live)
                    result = core.restore_locked(live, restore, Reason.GENERATE)
                    restored_from, resume_ms = result.restored_from, result.resume_ms
                live.block_table.extend(extra)
                extra = []
                core.transitions.tool_return(live)
                new = self._decode(live, prompt_tokens, max_new_tokens, temperature, seed)
            finally:
                self.release(live, extra)
                self._trim(live)
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

    def adopt_kv(
        self,
        tenant: str,
        session_id: str,
        tokens: Sequence[int],
        block_ids: Sequence[int],
        next_logits: np.ndarray,
    ) -> SessionRow:
        """Give a new, empty session KV that was prefilled outside agentpark.

        For benchmarks and engines that prefill on their own. ``block_ids`` must already be
        allocated to the session in ``engine.allocator``, number exactly
        ``blocks_for(len(tokens))`` and hold the KV of ``tokens`` in order.
        """
        core = self.core
        live = core.live(tenant, session_id)
        with core.registry.operation(live, "adopt"):
            row = live.row
            if row.state != State.ACTIVE or live.tokens or live.block_table:
                raise InvalidStateError("only a new, empty, active session can adopt KV")
            needed = self.geometry.blocks_for(len(tokens))
            if len(block_ids) != needed:
                raise InvalidRequestError(
                    f"{len(tokens)} tokens need {needed} blocks, got {len(block_ids)}"
                )
            if sorted(self.engine.allocator.owned(live.key)) != sorted(block_ids):
                raise InvalidRequestError("the blocks are not (all) allocated to this session")
            live.tokens = list(tokens)
            live.block_table = list(block_ids)
            live.next_logits = np.asarray(next_logits, dtype=np.float32)
            now = time.time()
            core.transitions.sync_kv(live)
            row.last_active_at = now
            event = core.events.event(
                row, EventKind.ADOPT, now, to_state=State.ACTIVE, nbytes=row.kv_bytes
            )
            core.transitions.commit(live, event)
            return row

    def check_invariants(self) -> None:
        """Pool and tier accounting agree with the sessions (tests and debugging)."""
        alloc = self.engine.allocator
        alloc.check_invariants()
        self.core.check_invariants(owned=lambda live: alloc.owned(live.key))
        held = [b for live in self.core.registry.all() for b in live.block_table]
        assert len(held) == len(set(held)), "a block is owned twice"
        assert len(held) == alloc.num_used, "blocks used by no session"

    # ---- steps --------------------------------------------------------------------------

    def _make_room(self, live: LiveSession, needed: int) -> None:
        """Park idle sessions, least recently used first, until ``needed`` blocks are free.

        Never one that an operation holds (a generate in flight), never the caller. If
        parking every idle session would still not make room, park none: the caller then
        waits in the queue for blocks to be freed.
        """
        short = needed - self.engine.allocator.num_free
        if short <= 0:
            return
        others = [o for o in self.core.registry.all() if o is not live]
        views = [SessionView.of(o.row, o.busy, len(o.block_table)) for o in others]
        chosen = least_recently_used(views, short)
        if sum(v.kv_blocks for v in chosen) < short:
            return
        for view in chosen:
            try:
                self.core.pause(*view.key, PauseOrder(reason=Reason.PRESSURE))
            except AgentparkError as exc:  # busy by now, or no tier has room
                log.debug("pressure: could not park %s: %s", view.key, exc.message)

    def _decode(
        self,
        live: LiveSession,
        prompt_tokens: Sequence[int],
        max_new_tokens: int,
        temperature: float,
        seed: int,
    ) -> list[int]:
        row = live.row
        started = time.perf_counter()
        logits = live.next_logits
        old_len, old_logits = len(live.tokens), live.next_logits  # put back if refused
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
            self.core.transitions.sync_kv(live)
            row.last_active_at = now
            event = self.core.events.event(
                row,
                EventKind.GENERATE,
                now,
                to_state=State.ACTIVE,
                duration_ms=(time.perf_counter() - started) * 1e3,
                detail=f"prompt={len(prompt_tokens)} new={len(new)}",
            )
            try:
                self.core.transitions.commit(live, event)
            except StorageUnavailableError:  # as if this call never ran (its blocks: _trim)
                del live.tokens[old_len:]
                live.next_logits = old_logits
                raise
            self.core.counters.tokens_generated += len(new)
        return new

    def _trim(self, live: LiveSession) -> None:
        """Give back blocks beyond what the token log needs (after a failed or short run)."""
        keep = self.geometry.blocks_for(len(live.tokens))
        surplus = live.block_table[keep:]
        if surplus:
            self.release(live, surplus)
            live.block_table = live.block_table[:keep]
            self.core.transitions.sync_kv(live)


def in_process_core(
    store: SessionStore,
    engine: EngineAdapter,
    transfer: Transfer,
    tiers: Sequence[HostTier],
    *,
    max_new_tokens: int = 512,
    options: CoreOptions | None = None,
) -> InProcessDriver:
    """A session core over ``engine`` with its driver; sessions in SQLite are re-attached.

    The core is ``driver.core``.
    """
    options = options or CoreOptions()
    driver = InProcessDriver(engine, transfer, max_new_tokens)
    mover = Mover(
        engine.geometry,
        tiers,
        transfer,
        options.checksum_tiers,
        key_algo=options.key_algo,
        key_seed=options.key_seed,
    )
    driver.core = SessionCore(store, driver, mover, options)
    driver.core.registry.on_release.append(driver.admission.notify)
    recover(driver.core)
    return driver
