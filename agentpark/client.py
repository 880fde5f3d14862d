"""A Python client of the agentpark REST API: ``AgentparkClient`` and its async twin.

One method per route, taking keyword arguments and returning the API's own pydantic
models (``agentpark.api.schemas``, ``agentpark.snapshot.HostSnapshot``)::

    from agentpark.client import AgentparkAPIError, AgentparkClient

    with AgentparkClient("http://127.0.0.1:8470", tenant="team-a") as ap:
        ap.create_session("agent-1", metadata={"task": "trip planning"})
        ap.generate("agent-1", "Find flights to Lisbon.", max_new_tokens=32)
        paused = ap.pause("agent-1", tool="web_search", expected_resume_s=8)
        print(paused.decision, paused.why)  # parked, or kept when the pause is too short
        out = ap.generate("agent-1", " Result: 3 flights found.", max_new_tokens=32)
        print(out.text, out.resumed, out.restored_from)
        try:
            ap.get_session("nope")
        except AgentparkAPIError as exc:
            print(exc.status, exc.code)  # 404 session_not_found

``AsyncAgentparkClient`` has the same methods as coroutines (``async with``, ``await
ap.generate(...)``; ``iter_sessions`` is an async iterator).

The daemon is the one judge of a request: the client does not validate arguments, so
whatever the daemon refuses arrives as one ``AgentparkAPIError`` (status, code, message,
details from the error envelope), whichever version of the daemon it talks to. An
argument left as ``None`` is not sent, and the daemon's default applies. A daemon that
cannot be reached raises httpx's own ``httpx.TransportError``.

Each route is described once, by a function below that returns a ``_Call`` (method,
path, body, query, how to read the answer); both clients execute the same ``_Call``.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, ParamSpec, Protocol, Self, TypeVar, overload
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from agentpark import __version__
from agentpark.api.schemas import (
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
from agentpark.api.schemas_host import (
    HistoryResponse,
    LatencyResponse,
    LivenessResponse,
    ParkedPage,
    PeersResponse,
    PolicyResponse,
    ReloadResponse,
)
from agentpark.snapshot import HostSnapshot

__all__ = ["AgentparkAPIError", "AgentparkClient", "AsyncAgentparkClient"]

DEFAULT_URL = "http://127.0.0.1:8470"
TENANT_HEADER = "X-Agentpark-Tenant"
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
    """One session, deleted ones too (``GET /v1/sessions/{id}``)."""
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


# ---- the clients -------------------------------------------------------------------------


def _options(
    base_url: str, tenant: str | None, token: str | None, timeout: float | httpx.Timeout | None
) -> dict[str, Any]:
    headers = {"User-Agent": f"agentpark-client/{__version__}"}
    if tenant is not None:
        headers[TENANT_HEADER] = tenant
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return {"base_url": base_url, "headers": headers, "timeout": timeout}


class _Runs(Protocol):
    def _run(self, call: _Call[T]) -> T: ...


class _AsyncRuns(Protocol):
    async def _run(self, call: _Call[T]) -> T: ...


class _Route(Generic[P, T]):
    """A client method made from a route's function: call it, then run the ``_Call``."""

    def __init__(self, build: Callable[P, _Call[T]]) -> None:
        self.build = build
        self.__doc__ = build.__doc__
        self.signature = inspect.signature(build).replace(return_annotation=inspect.Signature.empty)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.qualname = name, f"{owner.__qualname__}.{name}"

    def _named(self, method: Callable[..., Any]) -> None:
        method.__name__, method.__qualname__ = self.name, self.qualname
        method.__doc__ = self.__doc__
        method.__signature__ = self.signature  # type: ignore[attr-defined]


class _Sync(_Route[P, T]):
    @overload
    def __get__(self, client: None, owner: type) -> Self: ...
    @overload
    def __get__(self, client: _Runs, owner: type) -> Callable[P, T]: ...
    def __get__(self, client: _Runs | None, owner: type) -> Self | Callable[P, T]:
        if client is None:
            return self
        build = self.build

        def method(*args: P.args, **kwargs: P.kwargs) -> T:
            return client._run(build(*args, **kwargs))

        self._named(method)
        return method


class _Async(_Route[P, T]):
    @overload
    def __get__(self, client: None, owner: type) -> Self: ...
    @overload
    def __get__(self, client: _AsyncRuns, owner: type) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(
        self, client: _AsyncRuns | None, owner: type
    ) -> Self | Callable[P, Coroutine[Any, Any, T]]:
        if client is None:
            return self
        build = self.build

        async def method(*args: P.args, **kwargs: P.kwargs) -> T:
            return await client._run(build(*args, **kwargs))

        self._named(method)
        return method


class AgentparkClient:
    """Blocking client of one daemon; every method is one HTTP request (see module doc).

    ``tenant`` is sent as ``X-Agentpark-Tenant`` and ``token`` as ``Authorization:
    Bearer`` when given; ``transport`` replaces httpx's network transport (tests, proxies).
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        tenant: str | None = None,
        token: str | None = None,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url
        self.tenant = tenant
        self._http = httpx.Client(**_options(base_url, tenant, token, timeout), transport=transport)

    def _run(self, call: _Call[T]) -> T:
        response = self._http.request(
            call.method,
            call.path,
            json=call.json,
            params=call.params,
            content=call.content,
            headers=call.headers,
        )
        return call.finish(response)

    create_session = _Sync(_create_session)
    get_session = _Sync(_get_session)
    list_sessions = _Sync(_list_sessions)
    delete_session = _Sync(_delete_session)
    generate = _Sync(_generate)
    pause = _Sync(_pause)
    resume = _Sync(_resume)
    move = _Sync(_move)
    events = _Sync(_events)
    host = _Sync(_host)
    drain = _Sync(_drain)
    reload_policy = _Sync(_reload_policy)
    policy = _Sync(_policy)
    history = _Sync(_history)
    latency = _Sync(_latency)
    parked = _Sync(_parked)
    peers = _Sync(_peers)
    healthz = _Sync(_healthz)
    readyz = _Sync(_readyz)
    request = _Sync(_request)

    def iter_sessions(
        self, *, state: str | None = None, page_size: int | None = None
    ) -> Iterator[SessionOut]:
        """Every session (of ``state``), oldest first, fetching pages as it goes."""
        cursor: str | None = None
        while True:
            page = self._run(_list_sessions(state=state, limit=page_size, cursor=cursor))
            yield from page.sessions
            if (cursor := page.next_cursor) is None:
                return

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncAgentparkClient:
    """``AgentparkClient``'s twin for asyncio: the same methods, as coroutines."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        tenant: str | None = None,
        token: str | None = None,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url
        self.tenant = tenant
        options = _options(base_url, tenant, token, timeout)
        self._http = httpx.AsyncClient(**options, transport=transport)

    async def _run(self, call: _Call[T]) -> T:
        response = await self._http.request(
            call.method,
            call.path,
            json=call.json,
            params=call.params,
            content=call.content,
            headers=call.headers,
        )
        return call.finish(response)

    create_session = _Async(_create_session)
    get_session = _Async(_get_session)
    list_sessions = _Async(_list_sessions)
    delete_session = _Async(_delete_session)
    generate = _Async(_generate)
    pause = _Async(_pause)
    resume = _Async(_resume)
    move = _Async(_move)
    events = _Async(_events)
    host = _Async(_host)
    drain = _Async(_drain)
    reload_policy = _Async(_reload_policy)
    policy = _Async(_policy)
    history = _Async(_history)
    latency = _Async(_latency)
    parked = _Async(_parked)
    peers = _Async(_peers)
    healthz = _Async(_healthz)
    readyz = _Async(_readyz)
    request = _Async(_request)

    async def iter_sessions(
        self, *, state: str | None = None, page_size: int | None = None
    ) -> AsyncIterator[SessionOut]:
        """Every session (of ``state``), oldest first, fetching pages as it goes."""
        cursor: str | None = None
        while True:
            page = await self._run(_list_sessions(state=state, limit=page_size, cursor=cursor))
            for session in page.sessions:
                yield session
            if (cursor := page.next_cursor) is None:
                return

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
