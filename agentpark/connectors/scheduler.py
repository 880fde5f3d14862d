"""The connector's scheduler side (vLLM's engine-core process): what to load, what to park.

- ``request_finished``: the turn ended. The daemon decides park or keep; to park it
  reserves slots in the host pool and the connector keeps the request's blocks (delayed
  free) until the worker has copied them (the next step), then the daemon commits.
- Or the daemon answers "pinned": the blocks stay allocated in vLLM (delayed free) and
  its own prefix cache serves the next turn; "dropped": freed now
  (agentpark.connectors.pins: when a pin is let go, and why).
- ``get_num_new_matched_tokens``: a request of a parked session: the whole blocks of its
  token prefix beyond vLLM's own cache that the parked copy holds (matched on token ids,
  at least one token left to compute); ``update_state_after_alloc`` takes the parked
  copy for the load into the blocks vLLM allocated. Loads are synchronous (before the
  forward that needs them).

A request's session is ``kv_transfer_params.agentpark.session_id``, else vLLM's own
``request.session_id`` (the body's ``session_id``, ``X-Session-ID``, ``vllm_xargs``), else
none (agentpark.connectors.hints, which also reads the ``agentpark.*`` actions of its
``kv_hints``); a request with none is decided in one place, :meth:`SchedulerSide._anonymous`.
A request's record lives from its first match to ``request_finished`` (vLLM calls it for
every request it frees, aborted ones too). :class:`OffScheduler` is this side with
agentpark off: it matches nothing and answers every turn "kept" with the reason.
Light (no vLLM, torch or JAX at run time): vLLM's objects are only read.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from agentpark.connectors.client import ControlClient
from agentpark.connectors.hints import Resolved, resolve
from agentpark.connectors.pins import EngineView, Pins
from agentpark.connectors.protocol import SessionParams, encode_tokens
from agentpark.connectors.steps import LoadMeta, StepPlan
from agentpark.connectors.toolcalls import ToolCallReader
from agentpark.connectors.turn_ends import (
    RequestRecord,
    TurnEnd,
    block_keys,
    request_id,
    turn_answer,
)

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.request import Request

__all__ = ["OffScheduler", "SchedulerSide"]

log = logging.getLogger("vllm.agentpark")


class SchedulerSide:
    """The scheduler side over the daemon's control socket; its plan goes to the worker."""

    def __init__(
        self,
        client: ControlClient,
        *,
        tenant: str,
        block_size: int,
        tools: ToolCallReader | None = None,
    ) -> None:
        self.client = client
        self.tools = tools  # the turn's tool from its output, when the client names none
        self.tenant = tenant
        self.block_size = block_size
        self._requests: dict[str, RequestRecord] = {}
        self._next = StepPlan()
        self.engine = EngineView(block_size)
        self.pins = Pins(client, freeable=self.engine.freeable)
        self.turn_end = TurnEnd(
            client, self.pins, self.engine, block_size, tools, self._engine_fields
        )

    @property
    def session_tenant(self) -> str:
        """Whose sessions these are: the token's tenant as the daemon said it in hello (the
        daemon never takes one from a frame), else the configured one until it has."""
        return self.client.tenant or self.tenant

    @property
    def requests_in_flight(self) -> int:
        """Requests of a session seen and not finished yet."""
        return len(self._requests)

    def _anonymous(self, request: Request, resolved: Resolved) -> SessionParams:
        """The one place a request that names no session is decided: served by content.

        Its prefix is matched against every parked block of the tenant (same cache salt
        and LoRA) and its turn end parked as an anonymous session (the daemon keeps those
        within a share of the pool and a short TTL); a pause hint still gives the tool.
        """
        pause = resolved.hints.pause
        if pause is None:
            return SessionParams(None)
        return SessionParams(None, pause.tool, pause.expected_resume_s)

    def _session(self, request: Request) -> tuple[Resolved, SessionParams | None]:
        """The request's session (kv_transfer_params, vLLM's session_id, else anonymous);
        None only when refused."""
        resolved = resolve(request, self.session_tenant)
        if resolved.refused is not None:
            return resolved, None
        return resolved, resolved.params or self._anonymous(request, resolved)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        num_tokens = getattr(request, "num_tokens", None) or len(request.all_token_ids)
        self.engine.asked(request.request_id, int(num_tokens), num_computed_tokens)
        _, params = self._session(request)
        if params is None:
            return 0, False
        record = self._requests.setdefault(request.request_id, RequestRecord(params))
        record.num_computed = num_computed_tokens
        tokens = list(request.all_token_ids)
        answer = self.client.call(
            "match",
            encode_tokens(tokens),
            session_id=params.session_id,
            num_computed=num_computed_tokens,
            **block_keys(request),
            request_id=request_id(request),
        )
        if answer is None or not answer.get("ok"):
            return 0, False
        n = int(answer.get("tokens", 0))
        limit = len(tokens) - 1 - num_computed_tokens
        if n <= 0 or n % self.block_size or n > limit:
            return 0, False
        return n, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self.engine.allocated(request.request_id)
        record = self._requests.get(request.request_id)
        (block_ids, *_rest) = blocks.get_block_ids()
        if self.pins.book.pins:  # the new request holds its blocks now: a pin can go
            session = record.params.session_id if record else None
            reused = record.num_computed if record else 0
            self.pins.returned(session, list(block_ids), reused, self._next)
        if num_external_tokens <= 0:
            return
        start = record.num_computed // self.block_size if record else 0
        end = start + num_external_tokens // self.block_size
        targets = list(block_ids[start:end])
        answer = None
        if record is not None:
            answer = self.client.call(
                "begin_load",
                encode_tokens(list(request.all_token_ids)),
                session_id=record.params.session_id,
                start_block=start,
                block_ids=list(block_ids[:end]),
                **block_keys(request),
                request_id=request_id(request),
            )
        if record is None or answer is None or not answer.get("ok"):
            # vLLM counted these tokens as loadable: say the blocks failed, it recomputes.
            if answer is not None:
                why = str(answer.get("error"))
                self.client.degraded("load_refused", f"the daemon refused a load: {why}")
            self._next.invalid.extend(targets)
            return
        self._next.loads.append(
            LoadMeta(
                request.request_id,
                int(answer["load_id"]),
                targets,
                [int(s) for s in answer["slots"]],
                _digests(answer.get("digests")),
                answer.get("pool_id"),
            )
        )
        record.restored_tokens = num_external_tokens
        record.restored_from = str(answer.get("tier", "shm"))
        record.load_blocks = tuple(targets)

    def build_plan(self, scheduled_tokens: int = 0) -> StepPlan:
        """This step's copies and releases for the worker; the next step starts an empty
        plan. Every step: the prefill meter, pins past their time, and pressure (a waiting
        request that got no blocks while pins hold some)."""
        self.engine.meter.step(scheduled_tokens)
        try:
            self.pins.tick(self._next)
            shortfall = self.engine.shortfall()
            if shortfall and self.pins.book.pins:
                self.pins.relieve(shortfall, self._next, engine=self._engine_fields())
        finally:
            plan, self._next = self._next, StepPlan()
        return plan

    def has_pending_block_frees(self) -> bool:
        """vLLM asks only when a running request cannot allocate: let a pin go (latest
        expected return first) so it waits a step for the blocks instead of preempting;
        True exactly while such releases are in flight."""
        if self.pins.in_flight:
            return True
        if not self.pins.book.pins:
            return False
        return self.pins.relieve(1, self._next, engine=self._engine_fields())

    def finished_sending(self, req_ids: set[str]) -> None:
        """The worker reported these requests: their blocks are freed now."""
        if self.pins.in_flight:
            self.pins.reported(req_ids)

    def shutdown(self) -> None:
        """vLLM stops: every pin let go (the daemon hears each one)."""
        self.pins.close("shutdown", self._next)

    def _engine_fields(self) -> dict[str, Any]:
        if (self.client.protocol or 0) < 4:
            return {}  # a daemon before control protocol 4 refuses fields it does not know
        return self.engine.fields(self.pins.blocks)

    def loads_failed(self, bad_blocks: set[int]) -> None:
        """The worker could not load these blocks: their requests restored nothing."""
        for record in self._requests.values():
            if record.load_blocks and bad_blocks.intersection(record.load_blocks):
                record.restored_tokens, record.restored_from = 0, None

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        record = self._requests.pop(request.request_id, None)
        self.engine.allocated(request.request_id)
        resolved, params = self._session(request)
        for cause, why in resolved.notes:  # once per request: vLLM finishes each once
            self.client.degraded(cause, f"request {request.request_id}: {why}")
        taken = resolved.hints.taken
        if resolved.refused is not None:
            # The client's own mistake: said for every request (the counter once per cause).
            why = resolved.refused
            log.info("agentpark: request %s not parked: %s", request.request_id, why)
            self.client.degraded(
                resolved.cause or "bad_params", f"request {request.request_id}: {why}"
            )
            return False, turn_answer("refused", why, None)
        assert params is not None  # refused is the only way to none
        if resolved.hints.release:
            return False, self._release(params, record, taken)
        keep, answer = self._park(request, block_ids, params, record)
        if answer is not None and taken:
            answer["agentpark"]["hints"] = list(taken)
        return keep, answer

    def _release(
        self, params: SessionParams, record: RequestRecord | None, taken: tuple[str, ...]
    ) -> dict[str, Any]:
        """The conversation's last turn (``agentpark.release``): nothing parked, the
        session deleted at the daemon with whatever it had parked."""
        if params.session_id is None:
            return turn_answer(
                "kept", "an anonymous request has no session to release", record, taken
            )
        answer = self.client.call("release", session_id=params.session_id)
        if answer is None:
            return turn_answer("kept", "the agentpark daemon did not answer", record, taken)
        if not answer.get("ok"):
            why = str(answer.get("error"))
            self.client.degraded(str(answer.get("cause", "refused")), f"release refused: {why}")
            return turn_answer("kept", why, record, taken)
        decision = "released" if answer.get("released") else "kept"
        return turn_answer(decision, str(answer.get("why")), record, taken)

    def _park(
        self,
        request: Request,
        block_ids: list[int],
        params: SessionParams,
        record: RequestRecord | None,
    ) -> tuple[bool, dict[str, Any] | None]:
        """The turn end: the daemon's answer carried out (agentpark.connectors.turn_ends)."""
        return self.turn_end.end(request, block_ids, params, record, self._next)


def _digests(raw: Any) -> list[str | None] | None:
    """A load's per-block digests as the daemon sent them (None: nothing to verify)."""
    if not isinstance(raw, list) or all(d is None for d in raw):
        return None
    return [None if d is None else str(d) for d in raw]


class OffScheduler(SchedulerSide):
    """The scheduler side with agentpark off: no match, no park, every turn says why."""

    def __init__(self, client: ControlClient, *, tenant: str, block_size: int, why: str) -> None:
        super().__init__(client, tenant=tenant, block_size=block_size)
        self.why = why

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return 0, False

    def _park(
        self,
        request: Request,
        block_ids: list[int],
        params: SessionParams,
        record: RequestRecord | None,
    ) -> tuple[bool, dict[str, Any] | None]:
        return False, turn_answer("kept", self.why, record)

    def _release(
        self, params: SessionParams, record: RequestRecord | None, taken: tuple[str, ...]
    ) -> dict[str, Any]:
        return turn_answer("kept", self.why, record, taken)
