"""Each run of ``agentpark bench vllm`` against the reference: turns that differ (tokens,
logprobs) by kind of turn, which turns agentpark restored, what the daemon decided at the
turn ends, and whether the bench fails."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentpark.bench.vllm.results import RunResult, TurnResult
from agentpark.bench.vllm.spec import VllmBenchSpec

__all__ = [
    "RESTORED",
    "RESTORED_AFTER_RECOMPUTE",
    "breakdown",
    "by_kind",
    "decisions",
    "differs",
    "failed",
    "mark_restored",
]


def differs(run: RunResult, reference: RunResult) -> tuple[int, int]:
    """(turns whose tokens differ, turns whose logprobs differ) from the reference's."""
    ref = {(t.agent, t.turn): t for t in reference.turns}
    tokens = logprobs = 0
    for turn in run.turns:
        other = ref.get((turn.agent, turn.turn))
        if other is None or turn.error or other.error:
            continue
        tokens += turn.tokens != other.tokens
        logprobs += turn.logprobs != other.logprobs
    return tokens, logprobs


def mark_restored(
    turns: Sequence[TurnResult], events: Sequence[dict[str, Any]], ids: Sequence[str]
) -> None:
    """Set each turn's ``restored_bytes`` from the daemon's events of the agents' sessions
    (``ids[agent]``): a ``resume`` event belongs to the turn after as many ``turn`` events
    of its session as came before it (a turn's end is reported when it finishes; the
    restore runs before its first token)."""
    agent_of = {session_id: agent for agent, session_id in enumerate(ids)}
    restored: dict[tuple[int, int], int] = {}
    ended: dict[int, int] = {}
    for event in sorted(events, key=lambda e: int(e["id"])):
        agent = agent_of.get(str(event.get("session_id")))
        if agent is None:
            continue
        if event.get("kind") == "turn":
            ended[agent] = ended.get(agent, 0) + 1
        elif event.get("kind") == "resume":
            key = (agent, ended.get(agent, 0))
            restored[key] = restored.get(key, 0) + int(event.get("bytes") or 0)
    for turn in turns:
        turn.restored_bytes = restored.get((turn.agent, turn.turn), 0)


_PRESSURE = "pressure"
_PIN_COPY = "pin_copy"
_PIN_COPY_LABEL = "copies behind pins"


def decisions(events: Sequence[dict[str, Any]]) -> dict[str, int]:
    """What the daemon did at the turn ends, counted: pinned, parked, dropped, and kept by
    reason (a pin let go under pressure, then parked or dropped, says so; a pin's copy
    taken behind it is ``copies behind pins``, not a park); and how pins ended, by cause
    (``unpin: return``, ``unpin: timeout``, ``unpin: pressure``, ...)."""
    counts: dict[str, int] = {}
    for event in events:
        kind = event.get("kind")
        why = str(event.get("detail") or "")
        pressure = event.get("reason") == _PRESSURE
        if kind == "pause" and event.get("reason") == _PIN_COPY:
            label = _PIN_COPY_LABEL  # a pin's copy, not a turn end of its own
        elif kind == "pause":
            label = "parked (pressure)" if pressure else "parked"
        elif kind == "pin":
            label = "pinned"
        elif kind == "drop":
            label = "dropped (pressure)" if pressure else "dropped"
        elif kind == "unpin":
            label = "unpin: " + str(event.get("reason") or why.split(" ")[0] or "?")
        elif kind == "keep":
            label = "kept: " + (why.split(" (")[0] if "break-even" not in why else "short pause")
        elif kind == "pause_failed":
            label = "park failed"
        else:
            continue
        counts[label] = counts.get(label, 0) + 1
    return counts


def by_kind(counts: dict[str, int]) -> dict[str, int]:
    """:func:`decisions`' counts folded to the four turn-end answers (pinned, parked,
    dropped, kept; pressure releases apart as ``released``), the pins with a copy behind
    them (``copies behind pins``, of the pinned) and pins ended by cause."""
    folded = {"pinned": 0, "parked": 0, "dropped": 0, "kept": 0}
    for label, n in counts.items():
        if label.startswith("unpin: "):
            folded[label] = folded.get(label, 0) + n
        elif label.endswith("(pressure)"):
            key = "released: " + label.split(" ")[0]
            folded[key] = folded.get(key, 0) + n
        elif label.startswith("kept"):
            folded["kept"] += n
        elif label == _PIN_COPY_LABEL:
            folded[label] = folded.get(label, 0) + n
        elif label in folded:
            folded[label] += n
    return folded


RESTORED = "restored turns"
RESTORED_AFTER_RECOMPUTE = "restored after a recompute"


def _computed(turn: TurnResult) -> int:
    return turn.prompt_tokens - turn.cached_tokens


def breakdown(run: RunResult, reference: RunResult) -> dict[str, tuple[int, int, int]]:
    """Per kind of turn, (tokens differ, logprobs differ, turns compared) against the
    reference:

    - first turns: nothing cached or restored in any run; a difference there is the
      servers' own batching, not a parked copy;
    - restored turns: agentpark restored blocks into the turn, and vLLM computed as many
      prompt tokens as the reference did in this turn and every earlier one of the agent,
      so the session's KV was built the same way: with one request at a time these must
      equal the reference to the bit;
    - restored after a recompute: restored, but vLLM computed a different number of
      tokens in this turn or an earlier one (it recomputed evicted blocks, and agentpark
      then parked and restored those bytes): the same math in another split may round
      differently;
    - other turns: later turns agentpark restored nothing into (served from vLLM's own
      cache, or recomputed).
    """
    ref = {(t.agent, t.turn): t for t in reference.turns}
    kinds = ("first turns", RESTORED, RESTORED_AFTER_RECOMPUTE, "other turns")
    counts = {kind: [0, 0, 0] for kind in kinds}
    same_so_far: dict[int, bool] = {}
    for turn in sorted(run.turns, key=lambda t: (t.agent, t.turn)):
        other = ref.get((turn.agent, turn.turn))
        if other is None or turn.error or other.error:
            same_so_far[turn.agent] = False
            continue
        same = same_so_far.get(turn.agent, True) and _computed(turn) == _computed(other)
        same_so_far[turn.agent] = same
        if turn.turn == 0:
            kind = "first turns"
        elif turn.restored_bytes:
            kind = RESTORED if same else RESTORED_AFTER_RECOMPUTE
        else:
            kind = "other turns"
        count = counts[kind]
        count[0] += turn.tokens != other.tokens
        count[1] += turn.logprobs != other.logprobs
        count[2] += 1
    return {kind: (t, lp, n) for kind, (t, lp, n) in counts.items()}


def failed(results: Sequence[RunResult], spec: VllmBenchSpec) -> bool:
    """Whether the bench fails: a request failed, or (one request at a time, ``exact``) a
    turn agentpark restored blocks into (in any client's run) differs from the reference
    in a token or logprob.

    Batched, the servers batch the same requests differently, and that alone moves
    logprobs and now and then a greedy token, first turns included (measured): those
    differences are printed and counted, and only the exact mode can judge them.
    """
    if any(r.errors() for r in results):
        return True
    reference = next((r for r in results if r.name == "reference"), None)
    if reference is None or not spec.exact:
        return False
    for parked in (r for r in results if r.with_agentpark):
        tokens, logprobs, _n = breakdown(parked, reference)[RESTORED]
        if tokens or logprobs:
            return True
    return False
