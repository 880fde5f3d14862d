"""Loads for an external engine: parked blocks of a request's prefix into its own blocks.

:meth:`Loads.prepare_load` names the slots (the session's own parked copy, or blocks
found by content, held for the load so nobody frees them meanwhile) and their digests;
the engine copies and verifies each block and reports :meth:`Loads.complete_load`. A
session whose own parked copy served the load is restored (PARKED -> ACTIVE); blocks
found by content restore a session without a state to change (active, lost, unnamed):
only the tokens it did not compute are counted, with a ``resume`` event when it is named.
A block that fails its digest is never handed out again.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence

from agentpark.enums import Reason, RestoredFrom, State
from agentpark.errors import InvalidStateError, NotFoundError, TransferError
from agentpark.parking.core import SessionCore
from agentpark.parking.external.host import ExternalHost
from agentpark.parking.external.lookup import NO_EXTRA, Lookup, RequestKeys
from agentpark.parking.external.plans import LoadInFlight, LoadPlan, Restored
from agentpark.parking.registry import LiveSession

__all__ = ["Loads", "check_owner"]


class Loads(Lookup):
    """Load plans: prepared, held, completed or failed."""

    def __init__(self, core: SessionCore, host: ExternalHost) -> None:
        super().__init__(core, host)
        self._ids = itertools.count(1)
        self._plans_lock = threading.Lock()
        self._loads: dict[int, LoadInFlight] = {}

    def prepare_load(
        self,
        tenant: str,
        session_id: str | None,
        tokens: Sequence[int],
        start_block: int,
        block_ids: Sequence[int],
        only_tier: str | None = None,
        owner: str | None = None,
        extra: RequestKeys = NO_EXTRA,
        request_id: str | None = None,
    ) -> LoadPlan:
        """Parked blocks ``start_block ..`` of ``tokens``'s prefix for the engine's
        ``block_ids[start_block:]`` (``block_ids``: the request's blocks from its first).
        A session whose own copy serves it is RESUMING and held until
        :meth:`complete_load`. ``only_tier``: the blocks must be in that tier (the only one
        the engine reads).

        ``request_id``: the engine's request the load serves; its events name it.

        InvalidStateError (or SessionBusyError) when the blocks cannot serve that load now.
        """
        end = len(block_ids)
        if not 0 <= start_block < end:
            raise InvalidStateError("the parked blocks do not hold those blocks")
        load_id = next(self._ids)
        hold = ("load", load_id)
        found = self.find(tenant, session_id, tokens, only_tier, extra, max_blocks=end)
        if found is None or len(found.slots) < end:
            own = self.core.registry.find((tenant, session_id)) if session_id else None
            if own is not None and own.row.tier not in (None, only_tier) and only_tier:
                raise InvalidStateError(
                    f"the parked copy is in the {own.row.tier} tier, not {only_tier}",
                    state=own.row.state,
                )
            raise InvalidStateError("the parked blocks do not hold those blocks")
        live = found.own
        core = self.core
        if live is not None:
            core.registry.acquire(live, "restore")
            live.request_id = request_id
        try:
            if live is not None:
                if live.row.state != State.PARKED or live.slots[:end] != found.slots:
                    raise InvalidStateError("the parked copy changed meanwhile")
                core.transitions.begin_restore(live)
            # Held until the load is done: a shared block outlives its other holders' end.
            found.tier.hold(hold, found.slots[start_block:end])
        except BaseException:
            if live is not None:
                if live.row.state == State.RESUMING:
                    core.transitions.abort_restore(
                        live, [], TransferError("the load was not planned"), found.tier.name
                    )
                core.registry.release(live)
            raise
        plan = LoadPlan(
            load_id,
            found.tier.name,
            tuple(found.slots[start_block:end]),
            tuple(found.digests[start_block:end]),
            start_block,
        )
        key = (tenant, session_id) if session_id else None
        with self._plans_lock:
            self._loads[load_id] = LoadInFlight(
                plan,
                key,
                found.tier,
                list(block_ids),
                list(tokens[: end * self.geometry.block_size]),
                owner,
                own=live is not None,
                request_id=request_id,
            )
        return plan

    def complete_load(
        self, load_id: int, ok: bool, cause: str | None = None, *, owner: str | None = None
    ) -> Restored:
        """The engine loaded the plan's blocks (``ok``), or did not (``cause``).

        ``cause == "checksum"``: a block is damaged: the blocks are never handed out
        again; a session whose own copy it was is dropped (a ``corrupt`` event, LOST) and
        the engine recomputes (a ``recompute`` event). Another cause (the blocks could not
        be read): a parked session stays PARKED.
        """
        with self._plans_lock:
            check_owner(self._loads.get(load_id), owner, f"load {load_id}")
            load = self._loads.pop(load_id, None)
        if load is None:
            return Restored(0, None, "unknown load (finished already or expired)")
        try:
            return self._complete(load, ok, cause)
        finally:  # blocks still good stay findable (a damaged one was forgotten above)
            load.tier.free(("load", load_id), cache=True)

    def _complete(self, load: LoadInFlight, ok: bool, cause: str | None) -> Restored:
        core = self.core
        tier_name = load.tier.name
        loaded = len(load.plan.slots)
        restored = loaded * self.geometry.block_size
        if not ok and cause == "checksum":
            load.tier.forget(load.plan.slots)
        live = core.registry.find(load.key) if load.key else None
        if not load.own:
            if not ok:
                why = "a parked block failed its checksum; recomputed"
                return Restored(0, None, why if cause == "checksum" else cause or "not loaded")
            core.counters.prefill_tokens_avoided += restored
            if live is not None:
                self._content_restored(live, load, restored)
            return Restored(restored, RestoredFrom(tier_name), f"restored {restored} tokens")
        if live is None:
            return Restored(0, None, "the session was deleted")
        try:
            if ok:
                self._finish_load(load, State.PARKED, recomputed=False)
                core.counters.prefill_tokens_avoided += restored
                return Restored(restored, RestoredFrom(tier_name), f"restored {restored} tokens")
            if cause == "checksum":
                core.transitions.lose_corrupt(live, tier_name)
                core.transitions.begin_restore(live)
                self._finish_load(load, State.LOST, recomputed=True)
                return Restored(0, None, "the parked copy failed its checksum; recomputed")
            failure = TransferError(cause or "the engine could not load", operation="resume")
            core.transitions.abort_restore(live, [], failure, tier_name)
            return Restored(0, None, failure.message)
        finally:
            core.registry.release(live)

    def _finish_load(self, load: LoadInFlight, from_state: State, *, recomputed: bool) -> None:
        """The engine holds the plan's tokens now (loaded, or recomputed): ACTIVE."""
        live = self.core.registry.find(load.key) if load.key else None
        assert live is not None
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

    def _content_restored(self, live: LiveSession, load: LoadInFlight, tokens: int) -> None:
        """A named session got blocks by content: its event (no change of state)."""
        if live.busy:
            return  # its own operation writes its row; the counters have the tokens
        nbytes = len(load.plan.slots) * self.geometry.block_nbytes
        with self.core.registry.operation(live, "restore"):
            live.request_id = load.request_id
            self.core.transitions.restored_by_content(
                live, load.tier.name, nbytes, load.started, tokens
            )

    def expire_loads(self, cutoff: float) -> int:
        """Fail loads created before ``cutoff`` (monotonic): their engine went away."""
        with self._plans_lock:
            loads = [i for i, ld in self._loads.items() if ld.created < cutoff]
        for load_id in loads:
            self.complete_load(load_id, False, "the engine never reported the load")
        return len(loads)

    def fail_loads(self, why: str, owner: str | None = None) -> int:
        with self._plans_lock:
            loads = [i for i, ld in self._loads.items() if owner in (None, ld.owner)]
        for load_id in loads:
            self.complete_load(load_id, False, why)
        return len(loads)


def check_owner(plan: object, owner: str | None, what: str) -> None:
    """NotFoundError, before anything changes, for a plan ``owner`` may not finish."""
    plan_owner = getattr(plan, "owner", None)
    if plan is not None and owner is not None and plan_owner != owner:
        raise NotFoundError(f"{what} is not a plan of this connection")
