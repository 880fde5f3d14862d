"""The app in this process without a server: its lifespan on a portal's event loop, and
clients that hold a token of one tenant.

An in-process app has no bind, so it is built with ``anonymous=False`` (every request
needs a token) unless a test asks otherwise; its ``client(tenant)`` makes a token of that
tenant (sessions and operator scopes) in the app's database.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from anyio.from_thread import BlockingPortal, start_blocking_portal
from fastapi import FastAPI

from agentpark.app import create_app
from agentpark.auth import Gate, parse_scopes
from agentpark.client import AgentparkAPIError, AgentparkClient
from agentpark.config import Settings
from agentpark.runtime import Runtime

__all__ = [
    "SESSIONS_AND_OPERATOR",
    "InProcessApp",
    "TenantClient",
    "bearer",
    "make_token",
    "run_in_process",
]

SESSIONS_AND_OPERATOR = "sessions,operator"


class _PortalTransport(httpx.BaseTransport):
    """A blocking httpx transport onto an ASGI app whose event loop runs in another thread.

    Each request is handed to httpx's ``ASGITransport`` on that loop (the one the app's
    lifespan runs in) and waited for; requests from several threads run concurrently.
    """

    def __init__(self, app: FastAPI, portal: BlockingPortal) -> None:
        self._asgi = httpx.ASGITransport(app=app)
        self._portal = portal

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()  # a replayable body the async side can read too
        return self._portal.call(self._handle, request)

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        answer = await self._asgi.handle_async_request(request)
        raw = b"".join([chunk async for chunk in answer.aiter_raw()])
        return httpx.Response(answer.status_code, headers=answer.headers, content=raw)


class TenantClient(AgentparkClient):
    """A client with a token of one tenant; ``tenant`` and ``token`` kept for the test."""

    def __init__(self, url: str, tenant: str, token: str, **kwargs: Any) -> None:
        super().__init__(url, token=token, **kwargs)
        self.tenant = tenant
        self.token = token


def make_token(app: FastAPI, tenant: str, scopes: str = SESSIONS_AND_OPERATOR) -> str:
    """A new token of ``tenant`` in a running app's database (as `agentpark token create`)."""
    gate: Gate = app.state.gate
    token, _ = gate.store.create(tenant, parse_scopes(scopes))
    return token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class InProcessApp:
    """``create_app(settings)`` with its lifespan running in this process, and no server."""

    settings: Settings
    app: FastAPI
    transport: httpx.BaseTransport
    clients: list[AgentparkClient] = field(default_factory=list)

    @property
    def runtime(self) -> Runtime:
        runtime: Runtime = self.app.state.runtime
        return runtime

    def token(self, tenant: str = "default", scopes: str = SESSIONS_AND_OPERATOR) -> str:
        return make_token(self.app, tenant, scopes)

    def client(self, tenant: str = "default", scopes: str = SESSIONS_AND_OPERATOR) -> TenantClient:
        """A client of this app (closed with it) with a new token of ``tenant``."""
        token = self.token(tenant, scopes)
        client = TenantClient("http://in-process", tenant, token, transport=self.transport)
        self.clients.append(client)
        return client

    def forget_tenants(self) -> None:
        """Delete every session the clients handed out so far made, and close them."""
        for client in self.clients:
            try:
                for session in list(client.iter_sessions(page_size=1000)):
                    client.delete_session(session.session_id)
            except AgentparkAPIError as exc:  # a token without the sessions scope made none
                assert exc.status in (401, 403), exc
            client.close()
        self.clients.clear()


@contextmanager
def run_in_process(
    settings: Settings, config_path: Path | None = None, *, anonymous: bool = False
) -> Iterator[InProcessApp]:
    """Run the app's lifespan (runtime start, warm-up, shutdown) on a portal's event loop.

    No bind, so no loopback default unless ``anonymous``: every request needs a token.
    """
    app = create_app(settings, config_path, anonymous=anonymous)
    with start_blocking_portal() as portal, ExitStack() as stack:
        stack.enter_context(portal.wrap_async_context_manager(app.router.lifespan_context(app)))
        running = InProcessApp(settings, app, _PortalTransport(app, portal))
        stack.callback(running.forget_tenants)
        assert running.runtime.ready.wait(timeout=120), "engine warm-up did not finish"
        yield running
