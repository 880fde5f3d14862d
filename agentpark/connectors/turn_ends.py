"""A finished request's turn end, as the connector's scheduler side answers it.

The daemon decides (agentpark.policy.turn_end, under the session's lock); this carries
the answer out in vLLM's terms: ``parked`` keeps the blocks (delayed free) for the
worker's copy in the next step; ``pinned`` keeps them until the pin is let go
(agentpark.connectors.pins), with a copy behind the pin when the answer names slots
(protocol 5: the worker copies and vLLM still holds the blocks); ``dropped`` and
``kept`` free them now. Every answer says why in the response's ``kv_transfer_params``.
Light (no vLLM, torch or JAX at run time): vLLM's objects are only read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentpark.connectors.client import ControlClient
from agentpark.connectors.pins import EngineView, Pins, backed
from agentpark.connectors.protocol import SessionParams, encode_tokens
from agentpark.connectors.steps import StepPlan, store_meta
from agentpark.connectors.toolcalls import ToolCallReader

if TYPE_CHECKING:
    from vllm.v1.request import Request

__all__ = ["RequestRecord", "TurnEnd", "block_keys", "request_id", "turn_answer"]

BACKED_PINS = 5
"""The daemon's protocol from which a pinned answer may carry a copy to take behind it."""


@dataclass
class RequestRecord:
    """The scheduler side's record of one request of a session."""

    params: SessionParams
    num_computed: int = 0
    restored_tokens: int = 0
    restored_from: str | None = None
    load_blocks: tuple[int, ...] = ()


def request_id(request: Request) -> str | None:
    """vLLM's id of the request, for the daemon's events; None where the daemon's bound
    refuses it (over 256 characters or a control character: a client's X-Request-Id)."""
    rid = str(request.request_id)
    printable = all(not ("\x00" <= ch <= "\x1f" or "\x7f" <= ch <= "\x9f") for ch in rid)
    return rid if 0 < len(rid) <= 256 and printable else None


def block_keys(request: Request) -> dict[str, Any]:
    """What vLLM keys a request's blocks with besides its tokens (its cache salt and LoRA
    adapter), for the daemon to compute the same block-hash chain: never across salts."""
    keys: dict[str, Any] = {}
    salt = getattr(request, "cache_salt", None)
    if isinstance(salt, str) and salt:
        keys["cache_salt"] = salt
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        keys["lora"] = {"name": str(lora.lora_name), "path": str(lora.lora_path)}
    return keys


def turn_answer(
    decision: str, why: str, record: RequestRecord | None, hints: tuple[str, ...] = ()
) -> dict[str, Any]:
    """What the response's ``kv_transfer_params`` says of the turn (``hints``: the
    agentpark kv_hints actions taken, when there were any)."""
    ours: dict[str, Any] = {
        "decision": decision,
        "why": why,
        "restored_tokens": record.restored_tokens if record else 0,
        "restored_from": record.restored_from if record else None,
    }
    if hints:
        ours["hints"] = list(hints)
    return {"agentpark": ours}


class TurnEnd:
    """Asks the daemon what to do with a finished request's whole blocks, and does it."""

    def __init__(
        self,
        client: ControlClient,
        pins: Pins,
        engine: EngineView,
        block_size: int,
        tools: ToolCallReader | None,
        engine_fields: Callable[[], dict[str, Any]],
    ) -> None:
        self.client = client
        self.pins = pins
        self.engine = engine
        self.block_size = block_size
        self.tools = tools  # the turn's tool from its output, when the client names none
        self.engine_fields = engine_fields

    def end(
        self,
        request: Request,
        block_ids: list[int],
        params: SessionParams,
        record: RequestRecord | None,
        plan: StepPlan,
    ) -> tuple[bool, dict[str, Any] | None]:
        """Ask the daemon to park the turn's whole blocks; True keeps them for the worker
        (a park's copy) or the pin."""
        full = min(request.num_computed_tokens // self.block_size, len(block_ids))
        if full == 0:
            return False, turn_answer("kept", "no whole block of KV to park", record)
        tokens = list(request.all_token_ids)[: full * self.block_size]
        ids = [int(b) for b in block_ids[:full]]
        tool = params.tool
        if tool is None and self.tools is not None:
            tool = self.tools.tool_for(request, self.client.degraded)
        fields: dict[str, Any] = {
            "session_id": params.session_id,
            "tool": tool,
            "expected_resume_s": params.expected_resume_s,
            **block_keys(request),
            "request_id": request_id(request),
        }
        engine = self.engine_fields()
        backs = {"backs_pins": True} if (self.client.protocol or 0) >= BACKED_PINS else {}
        answer = self.client.call(
            "prepare_store", encode_tokens(tokens), block_ids=ids, **engine, **backs, **fields
        )
        if answer is None:
            return False, turn_answer("kept", self.client.last_miss, record)
        if not answer.get("ok"):
            why = str(answer.get("error"))
            self.client.degraded(str(answer.get("cause", "refused")), f"park refused: {why}")
            return False, turn_answer("kept", why, record)
        if answer.get("decision") == "pinned":
            return self._pinned(request, ids, tokens, answer, fields, record, plan)
        return self._carry_out(request, ids, answer, record, plan)

    def _carry_out(
        self,
        request: Request,
        ids: list[int],
        answer: dict[str, Any],
        record: RequestRecord | None,
        plan: StepPlan,
    ) -> tuple[bool, dict[str, Any] | None]:
        """A parked answer's copy planned (the blocks kept for it); else freed now."""
        decision = str(answer.get("decision"))
        if decision == "dropped":
            return False, turn_answer("dropped", str(answer.get("why")), record)
        if decision != "parked":
            return False, turn_answer("kept", str(answer.get("why")), record)
        plan.stores.append(store_meta(request.request_id, ids, answer))
        return True, turn_answer("parked", str(answer.get("why")), record)

    def _pinned(
        self,
        request: Request,
        ids: list[int],
        tokens: list[int],
        answer: dict[str, Any],
        fields: dict[str, Any],
        record: RequestRecord | None,
        plan: StepPlan,
    ) -> tuple[bool, dict[str, Any] | None]:
        """Pin the blocks (and copy them behind the pin when the answer names slots);
        over the pinned share here (a hard bound on this side too), offered again as
        pressure: parked or dropped."""
        copied = backed(answer)
        if self.pins.fits(len(ids), self.engine.total_blocks):
            self.pins.pin(request.request_id, ids, tokens, answer, fields)
            if copied:
                plan.stores.append(store_meta(request.request_id, ids, answer, hold=True))
            return True, turn_answer("pinned", str(answer.get("why")), record)
        session = str(answer.get("session_id") or fields["session_id"])
        if copied:  # the copy is planned: take it, and let the blocks go once it is done
            plan.stores.append(store_meta(request.request_id, ids, answer))
            self.pins.unpin(session, "pressure", len(ids))
            why = f"over the pinned share ({self.pins.share:.0%} of the engine's blocks)"
            return True, turn_answer("parked", f"{why}: the copy behind the pin kept", record)
        again = self.client.call(
            "prepare_store",
            encode_tokens(tokens),
            block_ids=ids,
            pressure=True,
            **self.engine_fields(),
            **fields,
        )
        self.pins.unpin(session, "pressure", len(ids))
        if again is None or not again.get("ok") or again.get("decision") == "pinned":
            why = f"over the pinned share ({self.pins.share:.0%} of the engine's blocks)"
            return False, turn_answer("dropped", why, record)
        return self._carry_out(request, ids, again, record, plan)
