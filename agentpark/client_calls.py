"""The REST routes as the client sees them: one function per route, building a ``_Call``
(method, path, body, query, how to read the answer) that both clients in
:mod:`agentpark.client` execute, so a route is described once."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from agentpark.schemas.auth import TokenCreate, TokenCreated, TokenOut, TokenPage
from agentpark.schemas.host import (
    HistoryResponse,
    LatencyResponse,
    LivenessResponse,
    ParkedPage,
    PeersResponse,
    PolicyResponse,
    ReloadResponse,
)
from agentpark.schemas.sessions import (
    DrainResponse,
    EventPage,
    GenerateRequest,
    GenerateResponse,
    MoveRequest,
    MoveResponse,
    PauseRequest,
    PauseResponse,
    ResumeResponse,
    SessionCreate,
    SessionOut,
    SessionPage,
)
from agentpark.snapshot import HostSnapshot

__all__ = ["DEFAULT_URL", "AgentparkAPIError"]

DEFAULT_URL = "http://127.0.0.1:8470"
# A generate that re-prefills a long context, or a drain, can take minutes.
DEFAULT_TIMEOUT = httpx.Timeout(300.0, connect=10.0)

T = TypeVar("T")
P = ParamSpec("P")
M = TypeVar("M", bound=BaseModel)


class AgentparkAPIError(Exception):
    """The daemon answered with an error (any non-2xx status), or with an unreadable body.

    ``code`` and ``message`` come from the envelope ``{"error": {"code", "message",
    "details"?}}``; a body that is not one (a proxy's HTML page, say) gives the code
    ``http_error`` and the start of the body as the message. A 2xx answer that does not
    parse as the expected model gives the code ``invalid_response``.
    """

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details

    @classmethod
    def from_response(cls, response: httpx.Response) -> AgentparkAPIError:
        try:
            error = response.json()["error"]
            code, message = str(error["code"]), str(error["message"])
            return cls(response.status_code, code, message, error.get("details"))
        except (ValueError, KeyError, TypeError, AttributeError):
            text = response.text.strip()[:200] or "(empty body)"
            reason = response.reason_phrase or "error"
            return cls(response.status_code, "http_error", f"HTTP {reason}: {text}")


# ---- how a route is called and its answer read (shared by both clients) ----------------


@dataclass(frozen=True)
class _Call(Generic[T]):
    method: str
    path: str
    read: Callable[[httpx.Response], T]
    json: Any = None
    params: Mapping[str, str | int | float] | None = None
    content: bytes | None = None
    headers: Mapping[str, str] | None = None
    also_ok: tuple[int, ...] = ()  # non-2xx statuses that ``read`` handles itself

    def options(self) -> dict[str, Any]:
        """The keyword arguments of ``httpx.Client.request`` (and the async one's)."""
        return {
            "json": self.json,
            "params": self.params,
            "content": self.content,
            "headers": self.headers,
        }

    def finish(self, response: httpx.Response) -> T:
        if not (response.is_success or response.status_code in self.also_ok):
            raise AgentparkAPIError.from_response(response)
        try:
            return self.read(response)
        except ValueError as exc:  # not JSON, or not the model (ValidationError is one)
            raise AgentparkAPIError(
                response.status_code, "invalid_response", f"{self.method} {self.path}: {exc}"
            ) from exc


def _model(cls: type[M]) -> Callable[[httpx.Response], M]:
    def read(response: httpx.Response) -> M:
        return cls.model_validate_json(response.content)

    return read


def _nothing(_response: httpx.Response) -> None:
    return None


def _raw(response: httpx.Response) -> httpx.Response:
    return response


def _ready(response: httpx.Response) -> bool:
    return response.status_code == 200


def _body(model: type[BaseModel], **given: Any) -> dict[str, Any]:
    """The JSON of ``model`` with the given fields, unvalidated: the daemon judges them."""
    fields = {k: v for k, v in given.items() if v is not None}
    return model.model_construct(**fields).model_dump(
        mode="json", exclude_unset=True, warnings=False
    )


def _params(**given: str | int | float | bool | None) -> dict[str, str | int | float]:
    """Query parameters, leaving out the unset ones; booleans as ``true``/``false``."""
    out: dict[str, str | int | float] = {}
    for key, value in given.items():
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif value is not None:
            out[key] = value
    return out


def _session(session_id: str, tail: str = "") -> str:
    return f"/v1/sessions/{quote(session_id, safe='')}{tail}"


def _create_session(
    session_id: str | None = None, *, metadata: Mapping[str, Any] | None = None
) -> _Call[SessionOut]:
    """Create a session (``POST /v1/sessions``); the daemon picks an id when none is given."""
    body = _body(SessionCreate, session_id=session_id, metadata=metadata)
    return _Call("POST", "/v1/sessions", _model(SessionOut), json=body)


def _get_session(session_id: str) -> _Call[SessionOut]:
    """One session (``GET /v1/sessions/{id}``); a deleted one is 404, its history in events."""
    return _Call("GET", _session(session_id), _model(SessionOut))


def _list_sessions(
    *, state: str | None = None, limit: int | None = None, cursor: str | None = None
) -> _Call[SessionPage]:
    """One page of sessions, oldest first; pass ``next_cursor`` on as ``cursor``."""
    params = _params(state=state, limit=limit, cursor=cursor)
    return _Call("GET", "/v1/sessions", _model(SessionPage), params=params)


def _delete_session(session_id: str) -> _Call[None]:
    """Delete a session (idempotent); its row stays as history."""
    return _Call("DELETE", _session(session_id), _nothing)


def _generate(
    session_id: str,
    prompt: str | None = None,
    *,
    prompt_tokens: Sequence[int] | None = None,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    seed: int | None = None,
    return_logits: bool | None = None,
) -> _Call[GenerateResponse]:
    """Append ``prompt`` (text) or ``prompt_tokens`` (ids) and decode; a parked session is
    resumed first, and the answer says so (``resumed``, ``restored_from``)."""
    body = _body(
        GenerateRequest,
        prompt=prompt,
        prompt_tokens=None if prompt_tokens is None else list(prompt_tokens),
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        return_logits=return_logits,
    )
    return _Call("POST", _session(session_id, "/generate"), _model(GenerateResponse), json=body)


def _pause(
    session_id: str,
    *,
    tool: str | None = None,
    expected_resume_s: float | None = None,
    tier: str | None = None,
    force: bool | None = None,
    wait: bool = True,
) -> _Call[PauseResponse]:
    """The agent calls a tool: park its KV, or keep it when the pause is too short
    (``decision``, ``why``). ``wait=False`` answers at once with state ``pausing``."""
    body = _body(
        PauseRequest, tool=tool, expected_resume_s=expected_resume_s, tier=tier, force=force
    )
    path = _session(session_id, "/pause")
    return _Call("POST", path, _model(PauseResponse), json=body, params=_params(wait=wait))


def _resume(session_id: str, *, wait: bool = True) -> _Call[ResumeResponse]:
    """Bring a session back into the pool; ``restored_from`` says from where."""
    path = _session(session_id, "/resume")
    return _Call("POST", path, _model(ResumeResponse), params=_params(wait=wait))


def _move(session_id: str, tier: str) -> _Call[MoveResponse]:
    """Move a parked session's copy to another tier (``dram``, ``shm``, ``disk``)."""
    body = _body(MoveRequest, tier=tier)
    return _Call("POST", _session(session_id, "/move"), _model(MoveResponse), json=body)


def _events(session_id: str | None = None, *, limit: int | None = None) -> _Call[EventPage]:
    """Transitions with reason, bytes and duration, newest first (``GET /v1/events``)."""
    params = _params(session_id=session_id, limit=limit)
    return _Call("GET", "/v1/events", _model(EventPage), params=params)


def _host() -> _Call[HostSnapshot]:
    """Pool totals, HBM reclaimed, tier use, sessions by state, counters (``/v1/host``)."""
    return _Call("GET", "/v1/host", _model(HostSnapshot))


def _drain() -> _Call[DrainResponse]:
    """Park every session into shm/disk and stop the daemon (``POST /v1/admin/drain``)."""
    return _Call("POST", "/v1/admin/drain", _model(DrainResponse))


def _reload_policy() -> _Call[ReloadResponse]:
    """Re-read the config file's policy section; a bad file is refused (422)."""
    return _Call("POST", "/v1/admin/reload", _model(ReloadResponse))


def _policy() -> _Call[PolicyResponse]:
    """The policy in force and the learned tool pauses (``GET /v1/admin/policy``)."""
    return _Call("GET", "/v1/admin/policy", _model(PolicyResponse))


def _tokens() -> _Call[TokenPage]:
    """Every token, revoked ones too, never a secret (``GET /v1/admin/tokens``; admin)."""
    return _Call("GET", "/v1/admin/tokens", _model(TokenPage))


def _create_token(tenant: str, scopes: Sequence[str]) -> _Call[TokenCreated]:
    """A new token of ``tenant`` with ``scopes``; ``.token`` is shown this once (admin)."""
    body = _body(TokenCreate, tenant=tenant, scopes=list(scopes))
    return _Call("POST", "/v1/admin/tokens", _model(TokenCreated), json=body)


def _revoke_token(token_id: str) -> _Call[TokenOut]:
    """Revoke a token by its id; refused by the daemon from the next request on (admin)."""
    path = f"/v1/admin/tokens/{quote(token_id, safe='')}"
    return _Call("DELETE", path, _model(TokenOut))


def _history(
    *, since: float | None = None, until: float | None = None, step: float | None = None
) -> _Call[HistoryResponse]:
    """Host samples, oldest first (``GET /v1/host/history``); negative times: before now."""
    params = _params(since=since, until=until, step=step)
    return _Call("GET", "/v1/host/history", _model(HistoryResponse), params=params)


def _latency(*, window_s: float | None = None) -> _Call[LatencyResponse]:
    """Pause and resume p50/p99, counts and bandwidth over a window (``/v1/host/latency``)."""
    return _Call(
        "GET", "/v1/host/latency", _model(LatencyResponse), params=_params(window_s=window_s)
    )


def _parked(*, limit: int | None = None) -> _Call[ParkedPage]:
    """The largest parked sessions of every tenant (``GET /v1/host/parked``)."""
    return _Call("GET", "/v1/host/parked", _model(ParkedPage), params=_params(limit=limit))


def _peers(*, since: float | None = None, step: float | None = None) -> _Call[PeersResponse]:
    """This host and each configured peer, up or down (``GET /v1/peers``)."""
    return _Call("GET", "/v1/peers", _model(PeersResponse), params=_params(since=since, step=step))


def _healthz() -> _Call[LivenessResponse]:
    """``{"status": "ok"}`` while the process answers (liveness)."""
    return _Call("GET", "/healthz", _model(LivenessResponse))


def _readyz() -> _Call[bool]:
    """True when the engine is warm (``/readyz`` 200), False while it warms up (503)."""
    return _Call("GET", "/readyz", _ready, also_ok=(503,))


def _request(
    method: str,
    path: str,
    *,
    json: Any = None,
    params: Mapping[str, str | int | float] | None = None,
    content: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> _Call[httpx.Response]:
    """Any route, as it is: the raw response of a 2xx answer, AgentparkAPIError otherwise."""
    return _Call(method, path, _raw, json, params, content, headers)
