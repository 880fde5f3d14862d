"""A vLLM turn end's answer: pin, park or drop, as a pure function of what is known then.

Inside vLLM a turn's blocks can stay allocated (a pin: the session's next request hits
them in vLLM's own prefix cache, nothing copied), be copied to the host pool and freed (a
park: the next request loads them back), or be freed at once (a drop: vLLM's LRU may
still hit them, else the next request recomputes). Each costs something else:

- a pin holds vLLM's blocks for the whole pause: worth it for a short pause, and only
  while pins stay within ``pin_share`` of the KV cache and the pool has room beside them;
- a park costs the copy back (the bytes at the measured bandwidth, plus overhead): worth
  it when that is less than recomputing the session's tokens (``prefill_ms_per_token``,
  measured by the connector on this engine), and only where the host pool has room;
- a drop costs the recompute, and nothing until then.

The rule (``adaptive``):

1. not under pressure, an expected pause shorter than ``pin_ttl_s``, and room for the
   pin -> pin, its time-out the expected pause x ``pin_margin`` (at least
   :data:`MIN_PIN_S`), capped by ``pin_ttl_s``; with a parked copy behind it (the
   connector copies the blocks at the turn end and still holds them) when a park would
   be worth it by 2 and the connector can (protocol 5): a pin let go under pressure or
   at its time-out then frees its blocks at once, with nothing to copy on the path of
   the request that needs them, and the session's next turn loads the copy if vLLM
   evicted the blocks meanwhile (a pin without a copy is only as good as vLLM's LRU);
2. else host room and the copy back cheaper than the recompute (or the recompute not yet
   measured) -> park;
3. else drop.

``pin`` (Continuum's rule: pins only) pins every turn for ``pin_ttl_s`` while there is
room and parks nothing: a turn with no room for its pin, and a pin let go under
pressure, are dropped (vLLM frees the blocks; its LRU may still hit them), as in
Continuum's vLLM without offloading; a pin's time-out frees its blocks the same way. A
pin under pressure (``pressure``: the connector is letting one go) is never pinned
again. The defaults (agentpark.config.sections, ``[vllm]``): a margin of 2 covers a
pause up to twice its median (the learned quantile) before the pin lets go; a cap of 30
s is where a person's turn starts (tools take seconds, people tens of seconds), past
which holding vLLM's blocks costs more than a park; pins may hold a quarter of the KV
cache (measured with ``agentpark bench vllm --pin-share``, 8 agents on 48 blocks: at
0.25 the same prefill as at 0.5 with a lower p50 / p99 TTFT after a tool, 0.79 / 2.97 s
against 0.97 / 4.84 s, the median of 3; at 0.75 requests waited behind pins for up to 27
s), so running requests always have the rest and at worst wait for a release of pins,
never a preemption.
"""

from __future__ import annotations

from agentpark.parking.external.plans import TurnEndChoice, TurnEndFacts, TurnEndRule

__all__ = ["MIN_PIN_S", "TurnEndChoice", "TurnEndFacts", "TurnEndRule", "choose"]

MIN_PIN_S = 1.0
"""The shortest pin (unless pin_ttl_s is shorter): a pause expected in milliseconds still
takes the client a round trip and vLLM a scheduler step or two to come back, and a pin
held a second longer than needed costs only that second of its blocks."""


_PIN_ONLY = "turn_end=pin parks nothing: dropped"


def _pin_room(facts: TurnEndFacts, rule: TurnEndRule) -> str | None:
    """None when the pin fits; else why it does not."""
    total = facts.engine_total_blocks
    if total is None:
        return "the engine's pool size is unknown"
    limit = rule.pin_share * total
    if facts.pinned_blocks + facts.blocks > limit:
        return (
            f"pins would hold {facts.pinned_blocks + facts.blocks} of {total} blocks, over "
            f"pin_share {rule.pin_share:g}"
        )
    free = facts.engine_free_blocks
    if free is not None and free < facts.blocks:
        return f"the pool is short of blocks ({free} free, the turn holds {facts.blocks})"
    return None


def _copy_back(facts: TurnEndFacts) -> tuple[bool, str]:
    """Whether a parked copy is worth its copy (the host pool has room and the copy back
    costs less than the recompute, or the recompute is not measured yet), and why."""
    if not facts.host_room:
        return False, "the host pool has no room"
    restore_s = facts.blocks * facts.block_bytes / max(facts.bandwidth_bps, 1.0)
    restore_s += facts.overhead_s / 2
    if facts.prefill_ms_per_token is None:
        return True, "the recompute is not measured yet"
    recompute_s = facts.tokens * facts.prefill_ms_per_token / 1e3
    if restore_s < recompute_s:
        return True, (
            f"the copy back ({restore_s * 1e3:.3g} ms) costs less than recomputing "
            f"{facts.tokens} tokens ({recompute_s * 1e3:.3g} ms)"
        )
    return False, (
        f"recomputing {facts.tokens} tokens ({recompute_s * 1e3:.3g} ms) costs no more than "
        f"the copy back ({restore_s * 1e3:.3g} ms)"
    )


def _park_or_drop(facts: TurnEndFacts, rule_why: str) -> TurnEndChoice:
    """2 and 3: park when the copy back is cheaper than the recompute, else drop."""
    worth, why = _copy_back(facts)
    if worth:
        suffix = " (as before)" if facts.prefill_ms_per_token is None else ""
        return TurnEndChoice("parked", f"{rule_why}; {why}: parked{suffix}")
    return TurnEndChoice("dropped", f"{rule_why}; {why}: dropped")


def choose(facts: TurnEndFacts, rule: TurnEndRule) -> TurnEndChoice:
    """Pin, park or drop (``rule.mode`` adaptive or pin), and why."""
    if facts.blocks <= 0:
        return TurnEndChoice("dropped", "no whole block to keep")
    if facts.pressure:
        if rule.mode == "pin":
            return TurnEndChoice("dropped", f"the pool needs the pinned blocks; {_PIN_ONLY}")
        return _park_or_drop(facts, "the pool needs the pinned blocks")
    no_room = _pin_room(facts, rule) if rule.pin_share > 0 else "pin_share is 0"
    expected, source = facts.expected_s, facts.expected_source
    if rule.mode == "pin":
        if no_room is None:
            return TurnEndChoice(
                "pinned", f"pinned for pin_ttl_s {rule.pin_ttl_s:g}s (turn_end=pin)", rule.pin_ttl_s
            )
        return TurnEndChoice("dropped", f"no room to pin: {no_room}; {_PIN_ONLY}")
    if expected is None:
        return _park_or_drop(facts, f"no expected pause ({source}): not pinned")
    if expected >= rule.pin_ttl_s:
        return _park_or_drop(
            facts,
            f"expected pause {expected:.3g}s ({source}) is not shorter than pin_ttl_s "
            f"{rule.pin_ttl_s:g}s",
        )
    if no_room is not None:
        return _park_or_drop(facts, f"expected pause {expected:.3g}s ({source}) but {no_room}")
    ttl = min(max(expected * rule.pin_margin, MIN_PIN_S), rule.pin_ttl_s)
    why = (
        f"expected pause {expected:.3g}s ({source}) is shorter than pin_ttl_s "
        f"{rule.pin_ttl_s:g}s and pins have room: pinned for {ttl:.3g}s"
    )
    backed = False
    if facts.backs_pins:
        backed, because = _copy_back(facts)
        why += f", a parked copy behind it ({because})" if backed else f", no copy ({because})"
    return TurnEndChoice("pinned", why, ttl, backed=backed)
