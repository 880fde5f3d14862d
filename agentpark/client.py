"""A Python client of the agentpark REST API: ``AgentparkClient`` and its async twin.

One method per route, taking keyword arguments and returning the API's own pydantic
models (``agentpark.schemas.sessions``, ``agentpark.snapshot.HostSnapshot``)::

    from agentpark.client import AgentparkAPIError, AgentparkClient

    with AgentparkClient("http://127.0.0.1:8470", token=os.environ["AGENTPARK_TOKEN"]) as ap:
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

The tenant is the token's (``agentpark token create --tenant NAME --scope sessions``);
without ``token=`` the client sends ``$AGENTPARK_TOKEN`` if set, else no token (a
loopback daemon with no token in its database serves tenant ``default`` then).

``AsyncAgentparkClient`` has the same methods as coroutines (``async with``, ``await
ap.generate(...)``; ``iter_sessions`` is an async iterator).

The daemon is the one judge of a request: the client does not validate arguments, so
whatever the daemon refuses arrives as one ``AgentparkAPIError`` (status, code, message,
details from the error envelope), whichever version of the daemon it talks to. An
argument left as ``None`` is not sent, and the daemon's default applies. A daemon that
cannot be reached raises httpx's own ``httpx.TransportError``.

Each route is described once, by a function in :mod:`agentpark.client_calls` that returns
a ``_Call`` (method, path, body, query, how to read the answer); both clients execute it.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, Generic, Protocol, Self, overload

import httpx

from agentpark import __version__
from agentpark.client_calls import (
    DEFAULT_TIMEOUT,
    DEFAULT_URL,
    AgentparkAPIError,
    P,
    T,
    _Call,
    _create_session,
    _create_token,
    _delete_session,
    _drain,
    _events,
    _generate,
    _get_session,
    _healthz,
    _history,
    _host,
    _latency,
    _list_sessions,
    _move,
    _parked,
    _pause,
    _peers,
    _policy,
    _readyz,
    _reload_policy,
    _request,
    _resume,
    _revoke_token,
    _tokens,
)
from agentpark.schemas.sessions import (
    SessionOut,
)

__all__ = ["AgentparkAPIError", "AgentparkClient", "AsyncAgentparkClient"]


# ---- the clients -------------------------------------------------------------------------


TOKEN_ENV = "AGENTPARK_TOKEN"


def _options(
    base_url: str, token: str | None, timeout: float | httpx.Timeout | None
) -> dict[str, Any]:
    headers = {"User-Agent": f"agentpark-client/{__version__}"}
    token = token if token is not None else os.environ.get(TOKEN_ENV) or None
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

    ``token`` is sent as ``Authorization: Bearer`` (default ``$AGENTPARK_TOKEN``); the
    tenant is the token's. ``transport`` replaces httpx's network transport (tests,
    proxies); ``on_response`` is called with every ``httpx.Response`` before it is read
    into a model (its headers: the daemon's ``Server-Timing``, say).
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        on_response: Callable[[httpx.Response], None] | None = None,
    ) -> None:
        self.base_url = base_url
        hooks = {"response": [on_response]} if on_response is not None else None
        options = _options(base_url, token, timeout)
        self._http = httpx.Client(**options, transport=transport, event_hooks=hooks)

    def _run(self, call: _Call[T]) -> T:
        return call.finish(self._http.request(call.method, call.path, **call.options()))

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
    tokens = _Sync(_tokens)
    create_token = _Sync(_create_token)
    revoke_token = _Sync(_revoke_token)
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
        token: str | None = None,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url
        options = _options(base_url, token, timeout)
        self._http = httpx.AsyncClient(**options, transport=transport)

    async def _run(self, call: _Call[T]) -> T:
        response = await self._http.request(call.method, call.path, **call.options())
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
    tokens = _Async(_tokens)
    create_token = _Async(_create_token)
    revoke_token = _Async(_revoke_token)
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
