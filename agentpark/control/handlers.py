"""The control ops of the vLLM service: one typed request of one connection -> its answer.

Who asks: every connection starts with ``hello`` carrying the connector's token, checked
by the daemon's :class:`~agentpark.auth.Gate` exactly as REST checks a bearer token (the
loopback default too, where REST allows it), and it needs the ``sessions`` scope, as
``GET /v1/vllm`` does. Until then every other op is refused (``unauthenticated``). The
token's tenant is the connection's for its life: a frame naming a ``tenant`` is refused
(agentpark.control.ops), so no frame acts on another tenant's sessions.

Whose plans: a park or load in flight (``store_id``, ``load_id``) belongs to the
connection that prepared it, and only it may complete it; another is answered
``not_found`` and the plan is left as it was. vLLM prepares on its scheduler's connection
and completes on its worker's (another process), so a connector may name its engine in
``hello`` (``peer``: vLLM's ``engine_id``): the connections of one tenant that name the
same engine share their plans. When the last connection of an owner closes, its plans in
flight are failed at once (the slots freed, the sessions active as before), as an answer
the connector never received is.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentpark import __version__
from agentpark.auth import Scope
from agentpark.connectors.protocol import PROTOCOL, ProtocolError, decode_tokens
from agentpark.control.ops import (
    BadRequest,
    BeginLoadAnswer,
    BeginLoadRequest,
    CompleteStoreAnswer,
    CompleteStoreRequest,
    DegradedAnswer,
    DegradedRequest,
    HelloAnswer,
    HelloRequest,
    LoadDoneAnswer,
    LoadDoneRequest,
    MatchAnswer,
    MatchRequest,
    PrepareStoreAnswer,
    PrepareStoreRequest,
    RegisterAnswer,
    RegisterRequest,
    ReleaseAnswer,
    ReleaseRequest,
    UnpinAnswer,
    UnpinRequest,
    parse_request,
)
from agentpark.control.server import Connection, refusal
from agentpark.enums import Decision, State, Tier
from agentpark.errors import (
    AgentparkError,
    CapacityError,
    ConfigError,
    SessionBusyError,
    SessionNotFoundError,
    UnauthenticatedError,
)
from agentpark.parking import PauseResult
from agentpark.parking.external import Pinned, StorePlan, TurnEndAsk, TurnEndRule
from agentpark.policy.turn_end import choose

if TYPE_CHECKING:
    from agentpark.control.vllm import VllmService

__all__ = ["ControlOps"]

log = logging.getLogger(__name__)

Answer = tuple[dict[str, Any], bytes]


class ControlOps:
    """The handler, undelivered and closed callbacks of a VllmService's control server."""

    def __init__(self, service: VllmService) -> None:
        self.service = service
        self._lock = threading.Lock()
        self._open: collections.Counter[str] = collections.Counter()  # owner -> connections
        self._ops: dict[type, Callable[[Connection, Any, bytes], Any]] = {
            RegisterRequest: self._register,
            MatchRequest: self._match,
            BeginLoadRequest: self._begin_load,
            LoadDoneRequest: self._load_done,
            PrepareStoreRequest: self._prepare_store,
            CompleteStoreRequest: self._complete_store,
            DegradedRequest: self._degraded,
            ReleaseRequest: self._release,
            UnpinRequest: self._unpin,
        }

    # ---- the server's callbacks -----------------------------------------------------------

    def handle(self, conn: Connection, message: dict[str, Any], blob: bytes) -> Answer:
        """One frame -> its answer; every refusal is an answer and changes nothing."""
        try:
            request = parse_request(message, blob)
        except BadRequest as exc:
            return refusal("bad_request", f"bad request: {exc}"), b""
        if isinstance(request, HelloRequest):
            return self._hello(conn, request)
        identity = conn.identity
        if identity is None:
            return refusal(
                "unauthenticated", "the connection's first frame must be hello with its token"
            ), b""
        tenant = identity.tenant
        try:
            return self._ops[type(request)](conn, request, blob).wire(), b""
        except BadRequest as exc:
            return refusal("bad_request", f"bad request: {exc}"), b""
        except ProtocolError as exc:
            return refusal("bad_request", f"bad request: {exc}"), b""
        except SessionBusyError as exc:
            self.service.count_degraded("session_busy", tenant=tenant)
            return refusal("session_busy", exc.message), b""
        except CapacityError as exc:
            self.service.count_degraded("pool_full", tenant=tenant)
            return refusal("pool_full", exc.message), b""
        except AgentparkError as exc:
            return refusal(exc.code, exc.message), b""

    def undelivered(
        self, conn: Connection, message: dict[str, Any], answer: dict[str, Any]
    ) -> None:
        """A park or load the connector never heard of: undo it at once."""
        op, driver, why = message.get("op"), self.service.driver, "the connector gave up waiting"
        if op == "prepare_store" and isinstance(answer.get("store_id"), int):
            driver.complete_store(answer["store_id"], False, None, why, owner=conn.owner)
        elif op == "begin_load" and isinstance(answer.get("load_id"), int):
            driver.complete_load(answer["load_id"], False, why, owner=conn.owner)
        else:
            return
        self.service.count_degraded("timeout", tenant=self._tenant(conn))

    def closed(self, conn: Connection) -> None:
        """A connection ended: the plans only it (or its engine's) could finish are failed."""
        owner = conn.owner
        if owner is None:
            return
        with self._lock:
            self._open[owner] -= 1
            if self._open[owner] > 0:
                return
            del self._open[owner]
        failed = self.service.driver.fail_all("the connector's connection closed", owner=owner)
        if failed:
            log.warning("vllm: %d copies in flight failed: their connection closed", failed)
            self.service.count_degraded("connection_closed", failed, tenant=self._tenant(conn))

    @staticmethod
    def _tenant(conn: Connection) -> str | None:
        return None if conn.identity is None else conn.identity.tenant

    # ---- the ops ----------------------------------------------------------------------------

    def _hello(self, conn: Connection, request: HelloRequest) -> Answer:
        if conn.said_hello:
            return refusal("bad_request", "bad request: hello was said on this connection"), b""
        gate = self.service.gate
        try:
            identity = gate.identify(None if request.token is None else f"Bearer {request.token}")
        except UnauthenticatedError as exc:
            return refusal(exc.code, exc.message), b""
        if Scope.SESSIONS not in identity.scopes:
            return refusal(
                "insufficient_scope", "the connector's token needs the 'sessions' scope"
            ), b""
        if identity.token_id is not None and (at := gate.due_for_touch(identity.token_id)):
            try:
                gate.store.touch(identity.token_id, at)
            except Exception:  # last_used_at is a convenience; never refuse for it
                log.warning("could not record the use of token %s", identity.token_id)
        peer = request.peer
        owner = f"conn:{conn.id}" if peer is None else f"peer:{identity.tenant}:{peer}"
        with self._lock:
            self._open[owner] += 1
        conn.identity, conn.owner, conn.said_hello = identity, owner, True
        answer = HelloAnswer(
            protocol=PROTOCOL,
            version=__version__,
            tenant=identity.tenant,
            pin_share=self.service.settings.vllm.pin_share,
        )
        return answer.wire(), b""

    def _register(self, conn: Connection, request: RegisterRequest, blob: bytes) -> RegisterAnswer:
        layout = request.layout.layout()
        if request.held is not None:
            held = self.service.register_held(layout, request.held.held())
            return RegisterAnswer(held=held)
        try:
            pool = self.service.register(layout, conn.owner)
        except ConfigError as exc:
            self.service.count_degraded("layout_refused", tenant=self._tenant(conn))
            raise BadRequest(f"layout refused: {exc.message}") from None
        return RegisterAnswer(pool=pool.to_wire())

    def _match(self, conn: Connection, request: MatchRequest, blob: bytes) -> MatchAnswer:
        assert conn.identity is not None
        n = self.service.driver.match(
            conn.identity.tenant,
            request.session_id,
            decode_tokens(blob),
            request.num_computed,
            Tier.SHM,
            request.extra(),
            request.request_id,
        )
        return MatchAnswer(tokens=n)

    def _begin_load(
        self, conn: Connection, request: BeginLoadRequest, blob: bytes
    ) -> BeginLoadAnswer:
        assert conn.identity is not None
        plan = self.service.driver.prepare_load(
            conn.identity.tenant,
            request.session_id,
            decode_tokens(blob).tolist(),
            request.start_block,
            request.block_ids,
            only_tier=Tier.SHM,  # the worker maps the pool file only
            owner=conn.owner,
            extra=request.extra(),
            request_id=request.request_id,
        )
        return BeginLoadAnswer(
            load_id=plan.load_id,
            tier=plan.tier,
            slots=list(plan.slots),
            digests=list(plan.digests),
            pool_id=self.service.pool_id,
        )

    def _load_done(self, conn: Connection, request: LoadDoneRequest, blob: bytes) -> LoadDoneAnswer:
        restored = self.service.driver.complete_load(
            request.load_id, request.ok, request.cause, owner=conn.owner
        )
        if not request.ok:
            cause = f"load_{request.cause or 'failed'}"
            self.service.count_degraded(cause, tenant=self._tenant(conn))
        return LoadDoneAnswer(
            restored_tokens=restored.tokens,
            restored_from=restored.restored_from,
            why=restored.why,
        )

    def _prepare_store(
        self, conn: Connection, request: PrepareStoreRequest, blob: bytes
    ) -> PrepareStoreAnswer:
        assert conn.identity is not None
        driver = self.service.driver
        tokens = decode_tokens(blob).tolist()
        needed = driver.geometry.blocks_for(len(tokens))
        if len(request.block_ids) != needed:
            raise BadRequest(
                f"{len(tokens)} tokens need {needed} blocks, got {len(request.block_ids)}"
            )
        result = driver.prepare_store(
            conn.identity.tenant,
            request.session_id,
            tokens,
            request.block_ids,
            tool=request.tool,
            expected_resume_s=request.expected_resume_s,
            tier=Tier.SHM,
            owner=conn.owner,
            extra=request.extra(),
            request_id=request.request_id,
            ask=self._ask(request),
        )
        answer = self._store_answer(result)
        driver.turn_ends.pins.answered(answer.decision)
        return answer

    def _store_answer(self, result: PauseResult | StorePlan | Pinned) -> PrepareStoreAnswer:
        """A pin (its time-out, order and name), a park (the copy to make), both (a pin
        with a parked copy behind it), or what was done instead."""
        pin = result if isinstance(result, Pinned) else getattr(result, "pin", None)
        pinned: dict[str, object] = {}
        if pin is not None:
            pinned = {
                "pin_ttl_s": pin.ttl_s,
                "expected_resume_s": pin.expected_s,
                "session_id": pin.row.session_id,
            }
        if isinstance(result, Pinned):
            return PrepareStoreAnswer(decision=Decision.PINNED, why=result.why, **pinned)
        if not isinstance(result, StorePlan):
            return PrepareStoreAnswer(decision=result.decision, why=result.why)
        return PrepareStoreAnswer(
            decision=Decision.PINNED if pin is not None else Decision.PARKED,
            why=result.why,
            store_id=result.store_id,
            slots=list(result.slots),
            fresh=list(result.fresh),
            checksum=result.checksum,
            pool_id=self.service.pool_id,
            **pinned,
        )

    def _ask(self, request: PrepareStoreRequest) -> TurnEndAsk:
        """The turn end's facts from the connector, with the rule that answers them."""
        settings = self.service.settings
        vllm, policy = settings.vllm, settings.policy
        return TurnEndAsk(
            rule=TurnEndRule(vllm.turn_end, vllm.pin_ttl_s, vllm.pin_margin, vllm.pin_share),
            choose=choose,
            engine_free_blocks=request.engine_free_blocks,
            engine_total_blocks=request.engine_total_blocks,
            pinned_blocks=request.pinned_blocks,
            pressure=request.pressure,
            prefill_ms_per_token=request.prefill_ms_per_token,
            overhead_s=policy.overhead_s,
            quantile=policy.tool_quantile,
            backs_pins=request.backs_pins,
        )

    def _complete_store(
        self, conn: Connection, request: CompleteStoreRequest, blob: bytes
    ) -> CompleteStoreAnswer:
        tier = self.service.tier
        checksummed = tier is not None and self.service.driver.core.mover.checksummed(tier)
        if request.ok and request.digests is None and checksummed:
            raise BadRequest("digests: required with ok true (the pool is checksummed)")
        result = self.service.driver.complete_store(
            request.store_id,
            request.ok,
            request.digests,
            None if request.detail is None else request.detail[:500],
            owner=conn.owner,
        )
        if result is None:
            return CompleteStoreAnswer(
                decision=Decision.NOT_PARKED, why="unknown store (expired or done)"
            )
        return CompleteStoreAnswer(decision=result.decision, why=result.why)

    def _degraded(self, conn: Connection, request: DegradedRequest, blob: bytes) -> DegradedAnswer:
        for cause, n in request.counts.items():
            self.service.count_degraded(cause, n, tenant=self._tenant(conn))
        return DegradedAnswer()

    def _unpin(self, conn: Connection, request: UnpinRequest, blob: bytes) -> UnpinAnswer:
        """A pin ended on the connector's side: forget it, count its cause and savings."""
        assert conn.identity is not None
        pin = self.service.driver.turn_ends.unpin(
            conn.identity.tenant, request.session_id, request.cause, request.reused_tokens
        )
        if pin is None:
            return UnpinAnswer(pinned=False, why="no such pin (ended already, or forgotten)")
        return UnpinAnswer(pinned=True, why=f"unpinned: {request.cause}")

    def _release(self, conn: Connection, request: ReleaseRequest, blob: bytes) -> ReleaseAnswer:
        """The session core's delete (its parked copy freed), in the connection's tenant."""
        assert conn.identity is not None
        core = self.service.driver.core
        try:
            before = core.get(conn.identity.tenant, request.session_id).state
            core.delete(conn.identity.tenant, request.session_id)
        except SessionNotFoundError:
            return ReleaseAnswer(released=False, why="no such session")
        if before == State.DELETED:
            return ReleaseAnswer(released=False, why="the session was released already")
        return ReleaseAnswer(released=True, why=f"conversation over: deleted ({before})")
