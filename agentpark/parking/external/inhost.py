"""Turn ends and restores for an external engine whose pool this process can reach.

An engine whose KV lives in host arrays here (a CPU engine in this process, the fake
engine of the tests) hands the core an :class:`~agentpark.parking.mover.ArrayPool`; the
core's mover then copies the bytes itself. These are the manager's two-phase plans with
the engine's half done here: the same transitions, events and checksums as vLLM's.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentpark.enums import TierChoice
from agentpark.errors import AgentparkError
from agentpark.parking.external.lookup import NO_EXTRA, RequestKeys
from agentpark.parking.external.manager import ExternalManager
from agentpark.parking.external.plans import Restored, StorePlan
from agentpark.parking.types import PauseResult

__all__ = ["park_turn", "restore_prefix"]


def park_turn(
    manager: ExternalManager,
    tenant: str,
    session_id: str | None,
    tokens: Sequence[int],
    block_ids: Sequence[int],
    *,
    tool: str | None = None,
    expected_resume_s: float | None = None,
    tier: str = TierChoice.AUTO,
    extra: RequestKeys = NO_EXTRA,
    request_id: str | None = None,
) -> PauseResult:
    """A turn ended: keep it, or copy the blocks the tier lacks before returning (the
    engine may free them afterwards). A failed copy is a NOT_PARKED result."""
    core = manager.core
    source = core.endpoint()
    plan = manager.prepare_store(
        tenant,
        session_id,
        tokens,
        block_ids,
        tool=tool,
        expected_resume_s=expected_resume_s,
        tier=tier,
        extra=extra,
        request_id=request_id,
    )
    if isinstance(plan, PauseResult):
        return plan
    assert isinstance(plan, StorePlan)  # no ask: never pinned
    dst = core.tiers[plan.tier]
    pos = [i for i, new in enumerate(plan.fresh) if new]
    slots = [plan.slots[i] for i in pos]
    try:
        core.mover.copy(source, [block_ids[i] for i in pos], dst, slots)
        dst.flush()
        digests = core.mover.block_digests(dst, slots)
    except Exception as exc:
        failed = manager.complete_store(plan.store_id, False, None, f"copy failed: {exc}")
        assert failed is not None
        return failed
    done = manager.complete_store(plan.store_id, True, digests if plan.checksum else None)
    assert done is not None  # the session is held by the plan until now
    return done


def restore_prefix(
    manager: ExternalManager,
    tenant: str,
    session_id: str | None,
    tokens: Sequence[int],
    block_ids: Sequence[int],
    extra: RequestKeys = NO_EXTRA,
    *,
    request_id: str | None = None,
) -> Restored:
    """Load the parked prefix of ``tokens`` into ``block_ids`` (the engine's blocks).

    Never raises for blocks that cannot be used: the answer then restores 0 tokens and
    says why, and the engine computes the prefix itself.
    """
    core = manager.core
    bs = manager.geometry.block_size
    n = manager.lookup(tenant, session_id, tokens, extra=extra) // bs
    if n == 0 or len(block_ids) < n:
        return Restored(0, None, "no whole block of the prefix is parked")
    try:
        source = core.endpoint()
        plan = manager.prepare_load(
            tenant,
            session_id,
            tokens,
            0,
            list(block_ids[:n]),
            extra=extra,
            request_id=request_id,
        )
    except AgentparkError as exc:
        return Restored(0, None, exc.message)
    tier = core.tiers[plan.tier]
    try:
        ok = core.mover.restore(
            tier, plan.slots, plan.slots, source, block_ids[:n], list(plan.digests)
        )
    except Exception as exc:
        return manager.complete_load(plan.load_id, False, f"copy failed: {exc}")
    return manager.complete_load(plan.load_id, ok, None if ok else "checksum")
