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

The state machine, tiers, events and checksums are the core's, the same as for the
in-process engine. Where the engine's pool is reachable from this process (host arrays,
:class:`~agentpark.parking.mover.ArrayPool`) the core's mover copies the bytes; an engine
in another process copies them itself between its tensors and the shared tier file.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agentpark.blocks import PoolGeometry
from agentpark.enums import EventKind, Reason, RestoredFrom, State, TierChoice
from agentpark.errors import AgentparkError, InvalidStateError, TransferError
from agentpark.parking.core import CoreOptions, PauseOrder, PauseResult, SessionCore
from agentpark.parking.mover import ArrayPool, Mover
from agentpark.parking.recovery import recover
from agentpark.parking.registry import LiveSession
from agentpark.snapshot import PoolFigures
from agentpark.store.repository import SessionStore
from agentpark.tiers.base import HostTier

__all__ = ["ExternalDriver", "Restored", "external_core"]


@dataclass(frozen=True)
class Restored:
    """What a restore gave the engine: ``tokens`` prefix tokens now in its blocks."""

    tokens: int
    restored_from: RestoredFrom | None  # None: nothing restored, the engine computes all
    why: str


class ExternalDriver:
    """The core's KV host for an engine that owns its pool; the engine's entry points."""

    backend_name = "external"

    def __init__(self, geometry: PoolGeometry, model_uid: str, pool: ArrayPool | None) -> None:
        self.geometry = geometry
        self.model_uid = model_uid
        self._pool = pool
        self.core: SessionCore  # set by external_core

    # ---- KVHost -------------------------------------------------------------------------

    def endpoint(self) -> ArrayPool | None:
        return self._pool

    def claim(self, live: LiveSession, n: int) -> list[int]:
        raise InvalidStateError(
            "this session's KV lives in an external engine: it is restored into the "
            "engine's blocks on the session's next turn, not by resume"
        )

    def release(self, live: LiveSession, blocks: Sequence[int]) -> None:
        """Nothing to do: the engine frees its own blocks once the call has returned."""

    def recompute(self, live: LiveSession, blocks: Sequence[int]) -> None:
        raise TransferError("the parked copy is unusable; the engine recomputes the prefix")

    def pool_figures(self) -> PoolFigures:
        """The engine's pool as far as the core knows it: blocks of sessions it holds."""
        block = self.geometry.block_nbytes
        total = self.geometry.num_blocks
        used = sum(
            len(live.block_table)
            for live in self.core.registry.all()
            if live.row.state == State.ACTIVE
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

    # ---- steps --------------------------------------------------------------------------

    def _matched(self, parked: Sequence[int], tokens: Sequence[int]) -> int:
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
        self, live: LiveSession, tokens: Sequence[int], block_ids: Sequence[int]
    ) -> None:
        core, row = self.core, live.row
        if row.state == State.PARKED:
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
        core.observe_tool_return(live)
        core.sync_kv(live)
        event = core.events.event(
            row,
            EventKind.TURN,
            now,
            from_state=from_state,
            to_state=State.ACTIVE,
            nbytes=row.kv_bytes,
            detail=f"tokens={len(tokens)} blocks={len(block_ids)}",
        )
        core.events.commit(row, event)


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
