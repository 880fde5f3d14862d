"""Which session a vLLM request is, and what agentpark actions its ``kv_hints`` carry.

vLLM (0.32) names a request's session itself: ``request.session_id``, which its OpenAI
server fills from the body's ``session_id``, else the ``X-Session-ID`` header, else
``vllm_xargs.session_id``. It also hands the connector an orchestrator's ``kv_hints``
envelope untouched (``request.kv_hints``: versioned actions whose payloads "are validated
by the component implementing the action"). A request's session is, in this order:
``kv_transfer_params.agentpark.session_id``, then ``request.session_id``, else none.

Actions of type ``agentpark.*`` are ours (:data:`ACTIONS`), each payload a strict model:
bounded, finite, typed as sent (``"60"`` is not a number), no unknown field. An action of
another type is left alone and counted (``hint_ignored``); an agentpark action that is
malformed (unknown type or version, bad payload, contradicting another) refuses agentpark
for that request: vLLM serves it, nothing is matched or parked, and ``hint_invalid`` is
counted. Light (pydantic only, as vLLM itself), and it never raises: a client's bad input
must not reach vLLM's scheduler as an exception.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentpark.connectors.protocol import (
    SESSION_ID_RE,
    TOOL_RE,
    SessionParams,
    parse_params,
    valid_session_id,
)

__all__ = [
    "ACTIONS",
    "ACTION_PREFIX",
    "MAX_ACTIONS",
    "Hints",
    "PausePayload",
    "PrefetchPayload",
    "ReleasePayload",
    "Resolved",
    "read_hints",
    "resolve",
]

ACTION_PREFIX = "agentpark."
MAX_ACTIONS = 64  # actions read of one envelope; more is a malformed envelope
MAX_EXPECTED_RESUME_S = 86_400.0  # as kv_transfer_params' and the control ops' bound
_Tool = Annotated[str, Field(min_length=1, max_length=128, pattern=TOOL_RE.pattern)]
_Resume = Annotated[float, Field(ge=0.0, le=MAX_EXPECTED_RESUME_S)]


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class PausePayload(_Payload):
    """``agentpark.pause`` v1: this turn ends in a tool call; the tool and its expected
    time, for the park-or-keep decision (kv_transfer_params' own fields come first)."""

    tool: _Tool | None = None
    expected_resume_s: _Resume | None = None


class ReleasePayload(_Payload):
    """``agentpark.release`` v1: this is the conversation's last turn; nothing is parked
    and the session's parked copy is deleted (the daemon's ``release`` op)."""


class PrefetchPayload(_Payload):
    """``agentpark.prefetch`` v1: the session is expected back within ``expected_resume_s``.

    Accepted and validated, and it changes nothing: the connector loads a parked copy when
    vLLM schedules the session's next request, from host memory; vLLM has no earlier
    place to bring it to.
    """

    expected_resume_s: _Resume | None = None


ACTIONS: dict[str, dict[str, type[_Payload]]] = {
    "agentpark.pause": {"1": PausePayload},
    "agentpark.release": {"1": ReleasePayload},
    "agentpark.prefetch": {"1": PrefetchPayload},
}
"""Every agentpark action type, by version: its payload's model."""


@dataclass(frozen=True)
class Hints:
    """The agentpark actions of one envelope, validated; ``invalid`` says why not."""

    pause: PausePayload | None = None
    release: bool = False
    prefetch: PrefetchPayload | None = None
    taken: tuple[str, ...] = ()  # "agentpark.pause/1", ... in the envelope's order
    ignored: tuple[str, ...] = ()  # the action types that are not ours (bounded names)
    invalid: str | None = None


def _shown(value: object) -> str:
    """A client's value in a message: bounded, and as repr (no control characters)."""
    return repr(value)[:48] if isinstance(value, str) else type(value).__name__


def _why(exc: ValidationError) -> str:
    """The first errors, by field, without the values sent (as the control ops')."""
    parts = []
    for error in exc.errors(include_input=False, include_url=False)[:3]:
        where = ".".join(str(p) for p in error["loc"]) or "payload"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def read_hints(envelope: object) -> Hints:
    """An envelope (vLLM's ``KvHintsEnvelope``, or None) -> its agentpark actions."""
    if envelope is None:
        return Hints()
    actions = getattr(envelope, "actions", None)
    if not isinstance(actions, list | tuple):
        return Hints(invalid="kv_hints: the envelope has no list of actions")
    if len(actions) > MAX_ACTIONS:
        return Hints(invalid=f"kv_hints: {len(actions)} actions, at most {MAX_ACTIONS} are read")
    found: dict[str, _Payload] = {}
    taken: list[str] = []
    ignored: list[str] = []
    for action in actions:
        kind = getattr(action, "action_type", None)
        if not isinstance(kind, str) or not kind.startswith(ACTION_PREFIX):
            ignored.append(kind[:64] if isinstance(kind, str) else type(kind).__name__)
            continue
        versions = ACTIONS.get(kind)
        if versions is None:
            return Hints(invalid=f"kv_hints: unknown agentpark action type {_shown(kind)}")
        version = getattr(action, "action_version", None)
        model = versions.get(version) if isinstance(version, str) else None
        if model is None:
            return Hints(
                invalid=f"kv_hints: {kind} version {_shown(version)} is not one of "
                f"{sorted(versions)}"
            )
        if kind in found:
            return Hints(invalid=f"kv_hints: {kind} given twice")
        payload = getattr(action, "payload", None)
        if not isinstance(payload, dict):
            return Hints(invalid=f"kv_hints: {kind}'s payload must be an object")
        try:
            found[kind] = model.model_validate(payload)
        except ValidationError as exc:
            return Hints(invalid=f"kv_hints: {kind} v{version}: {_why(exc)}")
        taken.append(f"{kind}/{version}")
    if "agentpark.pause" in found and "agentpark.release" in found:
        return Hints(invalid="kv_hints: agentpark.pause and agentpark.release contradict")
    pause, prefetch = found.get("agentpark.pause"), found.get("agentpark.prefetch")
    return Hints(
        pause=pause if isinstance(pause, PausePayload) else None,
        release="agentpark.release" in found,
        prefetch=prefetch if isinstance(prefetch, PrefetchPayload) else None,
        taken=tuple(taken),
        ignored=tuple(ignored),
    )


@dataclass(frozen=True)
class Resolved:
    """A request's session and hints as the scheduler side serves them.

    ``params`` None: no session named anywhere (``SchedulerSide._anonymous`` decides).
    ``refused``: the client's own mistake (bad kv_transfer_params, a malformed agentpark
    action): vLLM serves the request, agentpark neither loads nor parks it, ``cause`` is
    counted. ``notes``: (cause, why) to count that refuse nothing.
    """

    params: SessionParams | None
    hints: Hints = field(default_factory=Hints)
    source: str | None = None  # "kv_transfer_params" or "session_id"
    refused: str | None = None
    cause: str | None = None
    notes: tuple[tuple[str, str], ...] = ()


def _merged(params: SessionParams, pause: PausePayload | None) -> SessionParams:
    """kv_transfer_params' own tool and expected_resume_s first, then the pause hint's."""
    if pause is None:
        return params
    return SessionParams(
        params.session_id,
        params.tool if params.tool is not None else pause.tool,
        params.expected_resume_s
        if params.expected_resume_s is not None
        else pause.expected_resume_s,
    )


def resolve(request: Any, tenant: str) -> Resolved:
    """A vLLM ``Request`` (its ``kv_transfer_params``, ``session_id``, ``kv_hints``) ->
    its session and hints; never raises."""
    hints = read_hints(getattr(request, "kv_hints", None))
    notes: list[tuple[str, str]] = []
    if hints.ignored:
        shown = ", ".join(sorted(set(hints.ignored))[:5])
        notes.append(("hint_ignored", f"kv_hints actions that are not agentpark's: {shown}"))
    parsed = parse_params(getattr(request, "kv_transfer_params", None), tenant)
    if isinstance(parsed, str):
        return Resolved(None, hints, refused=parsed, cause="bad_params", notes=tuple(notes))
    if hints.invalid is not None:
        return Resolved(
            None, hints, refused=hints.invalid, cause="hint_invalid", notes=tuple(notes)
        )
    params, source = parsed, "kv_transfer_params" if parsed is not None else None
    if params is None:
        named = getattr(request, "session_id", None)
        if valid_session_id(named):
            params, source = SessionParams(named), "session_id"
        elif named is not None:
            notes.append(
                (
                    "session_id_invalid",
                    f"vLLM's session_id {_shown(named)} is not 1-128 letters, digits or "
                    f"._:- ({SESSION_ID_RE.pattern}): served without a session",
                )
            )
    if params is None and (hints.pause is not None or hints.release):
        notes.append(("hint_ignored", "agentpark.pause or agentpark.release with no session"))
    if params is not None:
        params = _merged(params, hints.pause)
    return Resolved(params, hints, source, notes=tuple(notes))
