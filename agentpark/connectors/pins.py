"""Pins: a kept turn's blocks held allocated in vLLM (delayed free) until it is let go.

When the daemon answers "pinned" at a turn end, ``request_finished`` returns True with no
store: vLLM keeps the request's blocks allocated, and blocks still allocated stay in its
prefix cache's hash table, so the session's next request is served by vLLM's own prefix
cache. The blocks go back to vLLM only when the worker reports the request in
``get_finished``; the scheduler side asks for that through the step plan's ``release``
list. A pin is let go at the first of:

- ``return``: the session's next request holds its blocks (update_state_after_alloc);
- ``timeout``: its deadline passed (checked every engine step; the engine keeps stepping
  while a delayed-free request is held, so this runs also when no request does);
- ``pressure``: vLLM cannot allocate; latest expected return first, each one offered to
  the daemon again with ``pressure=True`` and parked (copied, then freed) or dropped; a
  pin with a parked copy behind it (``backed``: copied at the turn end while its blocks
  stay allocated) is freed at once, with nothing to copy on the waiting request's path;
- ``restart``: the control connection broke or a new daemon answered (its pins are gone);
- ``shutdown``: vLLM stops.

Pinned blocks never exceed ``pin_share`` of the engine's blocks. Light: no vLLM, no torch.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agentpark.connectors.client import ControlClient
from agentpark.connectors.protocol import encode_tokens
from agentpark.connectors.steps import StepPlan, store_meta

__all__ = ["DEFAULT_SHARE", "Pin", "PinBook", "Pins", "PrefillMeter", "backed"]

log = logging.getLogger("vllm.agentpark")

DEFAULT_SHARE = 0.25
"""The pinned share when the daemon's hello says none (the contract's default)."""


@dataclass
class Pin:
    """One pinned turn: what vLLM holds for it and what the daemon must hear when it ends."""

    req_id: str
    session_id: str
    block_ids: list[int]
    tokens: list[int]  # the turn's whole-block tokens (a pressure release offers them again)
    fields: dict[str, Any]  # prepare_store's other fields (tool, block keys, request id)
    expected_return: float  # monotonic time the session is expected back
    deadline: float  # monotonic time the pin is let go if it has not returned
    generation: int  # the control connection's generation it was made under
    backed: bool = False  # a parked copy behind it: a release frees at once, nothing copied


@dataclass
class PinBook:
    """The pins held, by request and by session; pure bookkeeping (no I/O)."""

    pins: dict[str, Pin] = field(default_factory=dict)

    @property
    def blocks(self) -> int:
        return sum(len(p.block_ids) for p in self.pins.values())

    def add(self, pin: Pin) -> None:
        self.pins[pin.req_id] = pin

    def take(self, req_id: str) -> Pin | None:
        return self.pins.pop(req_id, None)

    def of_session(self, session_id: str) -> Pin | None:
        return next((p for p in self.pins.values() if p.session_id == session_id), None)

    def holding(self, block_ids: Iterable[int]) -> Pin | None:
        """The pin whose last block a new request holds (it has the whole pinned prefix)."""
        held = set(block_ids)
        return next((p for p in self.pins.values() if p.block_ids[-1] in held), None)

    def expired(self, now: float) -> list[Pin]:
        return [p for p in self.pins.values() if p.deadline <= now]

    def stale(self, generation: int) -> list[Pin]:
        return [p for p in self.pins.values() if p.generation != generation]

    def pressure_order(self) -> list[Pin]:
        """Latest expected return first: the pin whose blocks will idle longest goes first."""
        return sorted(self.pins.values(), key=lambda p: p.expected_return, reverse=True)


def backed(answer: dict[str, Any]) -> bool:
    """Whether a ``pinned`` answer has a parked copy behind the pin (it names a store)."""
    return answer.get("store_id") is not None


def share_room(share: float, total_blocks: int) -> int:
    """The most blocks pins may hold on an engine of ``total_blocks``."""
    return max(0, int(share * total_blocks))


class PrefillMeter:
    """The engine's prefill cost per token, measured from the scheduler's own steps.

    ``step(tokens)`` is called at each ``build_connector_meta``: the time since the previous
    call is the previous step's wall time (its forward and the scheduling around it), and a
    step that scheduled at least ``min_tokens`` tokens is a prefill-heavy one (decode steps
    schedule one token per running request). The answer is the median of ms / token over
    the last ``window`` such steps (a median: a step after which the engine idled is an
    outlier, not a shift)."""

    def __init__(
        self, *, min_tokens: int = 32, window: int = 64, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.min_tokens = min_tokens
        self.clock = clock
        self._samples: deque[float] = deque(maxlen=window)
        self._last: tuple[float, int] | None = None

    def step(self, tokens: int) -> None:
        now = self.clock()
        if self._last is not None:
            started, scheduled = self._last
            if scheduled >= self.min_tokens and now > started:
                self._samples.append((now - started) * 1e3 / scheduled)
        self._last = (now, tokens)

    @property
    def ms_per_token(self) -> float | None:
        if not self._samples:
            return None
        ordered = sorted(self._samples)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class Pins:
    """The scheduler side's pins: made from a "pinned" answer, let go into the step plan.

    ``freeable`` says how many of a block list would really go back to vLLM's free queue
    (blocks another request also holds do not); without a block pool every block counts.
    """

    def __init__(
        self,
        client: ControlClient,
        *,
        freeable: Callable[[list[int]], int] = len,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.freeable = freeable
        self.clock = clock
        self.book = PinBook()
        self.in_flight: dict[str, int] = {}  # pressure releases not yet reported freed
        self._leaving: dict[str, Pin] = {}  # their pins: the daemon hears once they are
        self.released: dict[str, int] = {}  # releases by cause, since start
        self.release_ms: list[float] = []  # pressure: blocked allocation to blocks freed
        self._blocked_at: float | None = None

    @property
    def blocks(self) -> int:
        return self.book.blocks

    @property
    def share(self) -> float:
        share = self.client.pin_share
        return DEFAULT_SHARE if share is None else share

    def fits(self, n: int, total_blocks: int | None) -> bool:
        """Whether ``n`` more pinned blocks stay within the share (hard bound)."""
        if total_blocks is None:
            return False  # no block pool bound: the share cannot be enforced, so no pins
        return self.blocks + n <= share_room(self.share, total_blocks)

    def pin(
        self,
        req_id: str,
        block_ids: list[int],
        tokens: list[int],
        answer: dict[str, Any],
        fields: dict[str, Any],
    ) -> Pin:
        now = self.clock()
        ttl = max(float(answer.get("pin_ttl_s") or 0.0), 0.0)
        expected = answer.get("expected_resume_s")
        pin = Pin(
            req_id,
            str(answer.get("session_id") or fields.get("session_id")),
            block_ids,
            tokens,
            fields,
            now + (ttl if expected is None else float(expected)),
            now + ttl,
            self.client.generation,
            backed=backed(answer),
        )
        self.book.add(pin)
        return pin

    # ---- letting go ----------------------------------------------------------------------

    def returned(
        self, session_id: str | None, block_ids: list[int], reused: int, plan: StepPlan
    ) -> Pin | None:
        """A new request of a pinned session holds its blocks now: let the pin go."""
        pin = self.book.of_session(session_id) if session_id else None
        if pin is None and block_ids:
            pin = self.book.holding(block_ids)
        if pin is not None:
            self._let_go(pin, "return", plan, reused=reused)
        return pin

    def tick(self, plan: StepPlan) -> None:
        """Every step: pins past their deadline, and pins a lost daemon made."""
        if not self.book.pins:
            return
        generation = self.client.probe()
        for pin in self.book.stale(generation):
            self._let_go(pin, "restart", plan)
        for pin in self.book.expired(self.clock()):
            self._let_go(pin, "timeout", plan)

    def relieve(self, shortfall: int, plan: StepPlan, *, engine: dict[str, Any]) -> bool:
        """vLLM is ``shortfall`` blocks short: let pins go, latest expected return first,
        until that many blocks are on their way back. True when any release is in flight."""
        if self._blocked_at is None:
            self._blocked_at = self.clock()
        coming = sum(self.in_flight.values())
        for pin in self.book.pressure_order():
            if coming >= shortfall:
                break
            n = self.freeable(pin.block_ids)
            if n == 0:
                continue  # every block is also another request's: letting go frees none
            if pin.backed:  # its copy was taken at the turn end: free the blocks now
                self._let_go(pin, "pressure", plan)
            else:
                self._under_pressure(pin, plan, engine)
            self.in_flight[pin.req_id] = n
            coming += n
        if not self.in_flight:
            self._blocked_at = None
        return bool(self.in_flight)

    def reported(self, finished: Iterable[str]) -> None:
        """The worker reported these requests' blocks freed (vLLM frees them now)."""
        for req_id in finished:
            self.in_flight.pop(req_id, None)
            pin = self._leaving.pop(req_id, None)
            if pin is not None:  # after the worker's copy (a park is committed by then)
                self._unpin(pin, "pressure")
        if not self.in_flight and self._blocked_at is not None:
            took = (self.clock() - self._blocked_at) * 1e3
            self.release_ms.append(took)
            self._blocked_at = None
            log.info(
                "agentpark: pins let go under pressure: blocks free %.1f ms after vLLM "
                "could not allocate",
                took,
            )

    def close(self, cause: str, plan: StepPlan) -> None:
        """Let every pin go (vLLM's shutdown)."""
        for pin in list(self.book.pins.values()):
            self._let_go(pin, cause, plan)
        leaving, self._leaving = self._leaving, {}
        for pin in leaving.values():
            self._unpin(pin, cause)

    def _under_pressure(self, pin: Pin, plan: StepPlan, engine: dict[str, Any]) -> None:
        """Offer the pinned turn to the daemon again: parked (copy, then free) or dropped.
        Whatever happens (no answer, a refusal, an error here), the pin is let go."""
        self.book.take(pin.req_id)
        answer = None
        try:
            answer = self.client.call(
                "prepare_store",
                encode_tokens(pin.tokens),
                block_ids=pin.block_ids,
                pressure=True,
                **{**engine, "pinned_blocks": self.blocks},
                **pin.fields,
            )
            parked = bool(answer and answer.get("ok") and answer.get("decision") == "parked")
            store = store_meta(pin.req_id, pin.block_ids, answer) if answer and parked else None
        except Exception:  # never fail vLLM's scheduler: the blocks are freed instead
            log.exception("agentpark: a pressure release failed; the pin's blocks are freed")
            store = None
        if store is not None:
            plan.stores.append(store)
        else:
            plan.release.append(pin.req_id)
        self._leaving[pin.req_id] = pin

    def _let_go(self, pin: Pin, cause: str, plan: StepPlan, *, reused: int = 0) -> None:
        if self.book.take(pin.req_id) is None:
            return
        plan.release.append(pin.req_id)
        self._unpin(pin, cause, reused=reused)

    def _unpin(self, pin: Pin, cause: str, *, reused: int = 0) -> None:
        self.unpin(pin.session_id, cause, len(pin.block_ids), reused=reused)

    def unpin(self, session_id: str, cause: str, blocks: int, *, reused: int = 0) -> None:
        """Tell the daemon a pin ended (idempotent there; no answer changes nothing here)."""
        self.released[cause] = self.released.get(cause, 0) + 1
        log.debug("agentpark: pin of %s let go (%s)", session_id, cause)
        self.client.call(
            "unpin", session_id=session_id, cause=cause, blocks=blocks, reused_tokens=reused
        )


class EngineView:
    """What the scheduler side reads of vLLM's block pool (bound by vLLM after start):
    free and total blocks, which blocks a release would really free, and the waiting
    requests that asked for a match this step and got no blocks (pressure)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.pool: Any = None  # vLLM's BlockPool (bind_gpu_block_pool)
        self.meter = PrefillMeter()
        self._asked: dict[str, int] = {}  # request id -> blocks it still needs

    @property
    def total_blocks(self) -> int | None:
        """The engine's usable blocks (vLLM's pool has one null block besides)."""
        return None if self.pool is None else int(self.pool.num_gpu_blocks) - 1

    @property
    def free_blocks(self) -> int | None:
        return None if self.pool is None else int(self.pool.get_num_free_blocks())

    def freeable(self, block_ids: list[int]) -> int:
        """How many of these blocks a release gives back (held by no other request)."""
        if self.pool is None:
            return len(block_ids)
        return sum(1 for b in block_ids if self.pool.blocks[b].ref_cnt <= 1)

    def fields(self, pinned_blocks: int) -> dict[str, Any]:
        """prepare_store's view of the engine (control protocol 4)."""
        return {
            "engine_free_blocks": self.free_blocks,
            "engine_total_blocks": self.total_blocks,
            "pinned_blocks": pinned_blocks,
            "prefill_ms_per_token": self.meter.ms_per_token,
        }

    def asked(self, req_id: str, num_tokens: int, num_computed: int) -> None:
        """A waiting request is being admitted: the blocks it needs beyond its cache hit."""
        need = -(-num_tokens // self.block_size) - num_computed // self.block_size
        self._asked[req_id] = max(need, 1)

    def allocated(self, req_id: str) -> None:
        self._asked.pop(req_id, None)

    def shortfall(self) -> int:
        """Blocks a waiting request that got none this step lacks (0: none was blocked by
        the pool; a request left waiting for another reason needs no more than is free)."""
        free = self.free_blocks
        asked, self._asked = self._asked, {}
        if free is None or not asked:
            return 0
        return max(0, max(asked.values()) - free)
