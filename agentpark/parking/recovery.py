"""Recovery at start: re-attach the sessions SQLite knows to what survived the last process.

KV in the pool or the dram tier died with that process: those sessions become LOST and
are recomputed on resume. Sessions parked in a persistent tier whose file was re-attached
keep their slots and stay PARKED.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from agentpark.enums import Reason, State
from agentpark.parking.core import SessionCore
from agentpark.parking.handles import handle_digests, handle_keys, handle_slots
from agentpark.parking.registry import LiveSession
from agentpark.tiers.capabilities import Reattaching

__all__ = ["recover"]

log = logging.getLogger(__name__)


def recover(core: SessionCore) -> int:
    """Re-attach every live row; returns how many sessions were re-attached."""
    now = time.time()
    for row in core.store.live_rows():
        live = LiveSession(row, _decode_tokens(row.token_log), _decode_logits(row.next_logits))
        reason = _lost_reason(core, live)
        if reason is not None:
            event = core.transitions.lose(live, Reason.RESTART, reason, commit=False, at=now)
            core.events.commit_at_startup(row, event)
        elif row.state not in (State.PARKED, State.LOST, State.ACTIVE):
            core.transitions.settle_at_start(live)  # no tokens, so no KV to lose
        core.registry.add(live)
    if len(core.registry):
        log.info("re-attached %d sessions", len(core.registry))
    return len(core.registry)


def _lost_reason(core: SessionCore, live: LiveSession) -> str | None:
    """Why this session's KV did not survive, or None when it did (or it had none)."""
    row = live.row
    if row.state == State.LOST:
        return None
    if row.state != State.PARKED:
        if row.num_tokens == 0:
            return None
        return "daemon restarted: the KV pool is process memory"
    tier = core.tiers.get(row.tier or "")
    if tier is None:
        return f"daemon restarted: the {row.tier} tier is not enabled"
    if not tier.persistent:
        return f"daemon restarted: the {row.tier} tier is process memory"
    if not isinstance(tier, Reattaching):
        return f"daemon restarted: the {row.tier} tier cannot re-attach its copies"
    if tier.attach_problem:
        return f"{tier.name} tier file refused at start: {tier.attach_problem}"
    if not tier.reattached:
        return f"the {tier.name} tier file was gone at start (reboot or cleanup)"
    slots = handle_slots(row)
    keys, digests = handle_keys(row), handle_digests(row)
    if len(slots) != row.kv_blocks or len(keys) != len(slots):
        return f"parked copy index is inconsistent ({len(slots)} slots, {row.kv_blocks} blocks)"
    if digests is not None and len(digests) != len(slots):
        return f"parked copy index is inconsistent ({len(digests)} digests, {len(slots)} slots)"
    try:
        # A block several sessions share is claimed by each (same slot, same key).
        tier.claim(live.key, slots, keys, digests)
    except ValueError as exc:
        return f"cannot re-attach its {tier.name} slots: {exc}"
    live.slots, live.keys, live.digests = slots, keys, digests
    return None


def _decode_tokens(blob: bytes) -> list[int]:
    return np.frombuffer(blob, dtype="<i4").astype(int).tolist() if blob else []


def _decode_logits(blob: bytes | None) -> np.ndarray | None:
    return None if blob is None else np.frombuffer(blob, dtype=np.float32).copy()
