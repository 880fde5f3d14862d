"""The dashboard page and the JSON it reads: history, latency, parked sessions, peers.

``GET /dashboard`` is one self-contained HTML page (its stylesheet and script are inlined
from ``agentpark/dashboard/``; nothing is fetched from outside the daemon). It reads:

- ``GET /v1/host``: the figures of now;
- ``GET /v1/host/history?since=&until=&step=``: samples written by the host sampler;
- ``GET /v1/host/latency?window_s=``: pause/resume p50 and p99 and bandwidth, from events;
- ``GET /v1/host/parked?limit=``: the largest parked sessions, every tenant (an operator
  view, like /v1/host);
- ``GET /v1/peers``: this host and each ``dashboard.peers`` daemon, asked by this daemon
  with short timeouts; a peer that does not answer is ``"up": false`` with no figures,
  never zeros.

The page itself is open (it holds no data); the data routes need the ``operator`` scope.
The page sends ``Authorization: Bearer`` with a token it keeps in ``sessionStorage``: typed
into its token field, or given once as ``/dashboard#token=...`` (a fragment, so it never
reaches a server log; the page removes it from the address bar).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from functools import cache
from importlib import resources
from typing import Annotated

import httpx
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from agentpark.api.deps import AUTH_ERRORS, OPERATOR, RuntimeDep
from agentpark.api.errors_wire import error_responses
from agentpark.enums import State
from agentpark.errors import InvalidRequestError
from agentpark.history import bandwidth
from agentpark.runtime import Runtime, host_label
from agentpark.schemas.host import (
    HistoryResponse,
    HistorySample,
    LatencyResponse,
    ParkedPage,
    ParkedSession,
    PeerHost,
    PeerSample,
    PeersResponse,
    TransferLatency,
)
from agentpark.snapshot import HostSnapshot

__all__ = ["router"]

router = APIRouter()

MAX_POINTS = 2000
WEEK_S = 7 * 24 * 3600.0

Since = Annotated[
    float,
    Query(
        allow_inf_nan=False,
        description="epoch seconds, or negative: that many seconds before now; finite",
    ),
]
Until = Annotated[
    float | None,
    Query(
        allow_inf_nan=False,
        description="epoch seconds, or negative: before now; default now; finite",
    ),
]
Step = Annotated[
    float | None,
    Query(
        ge=0.0,
        le=WEEK_S,
        allow_inf_nan=False,
        description="seconds per point (merged on the fly); default raw",
    ),
]


@cache
def _page() -> str:
    files = resources.files("agentpark.dashboard")
    html = files.joinpath("index.html").read_text(encoding="utf-8")
    style = files.joinpath("dashboard.css").read_text(encoding="utf-8")
    script = files.joinpath("dashboard.js").read_text(encoding="utf-8")
    if "</script" in script.lower() or "</style" in style.lower():
        raise RuntimeError("dashboard assets must not close their own element")
    return html.replace("/*STYLE*/", style).replace("/*SCRIPT*/", script)


@router.get("/dashboard", tags=["dashboard"], response_class=HTMLResponse)
def get_dashboard() -> HTMLResponse:
    """The dashboard: HBM used and reclaimed over time, sessions, latency, tiers, peers."""
    return HTMLResponse(_page(), headers={"Cache-Control": "no-cache"})


# The page is open (it holds no data); every data route needs the operator scope.
_GUARD = [OPERATOR]
_ERRORS = error_responses(InvalidRequestError, *AUTH_ERRORS)


@router.get("/v1/host/history", tags=["host"], dependencies=_GUARD, responses=_ERRORS)
def get_history(
    runtime: RuntimeDep, since: Since = -3600.0, until: Until = None, step: Step = None
) -> HistoryResponse:
    """Host samples in a window, oldest first (see agentpark.history for each field)."""
    return _history(runtime, since, until, step)


@router.get("/v1/host/latency", tags=["host"], dependencies=_GUARD, responses=_ERRORS)
def get_latency(
    runtime: RuntimeDep,
    window_s: Annotated[float, Query(gt=0.0, le=WEEK_S, allow_inf_nan=False)] = 900.0,
) -> LatencyResponse:
    """Pause and resume latency p50/p99 and bandwidth over the last ``window_s`` seconds."""
    return _latency(runtime, window_s)


@router.get("/v1/host/parked", tags=["host"], dependencies=_GUARD, responses=_ERRORS)
def list_parked_sessions(
    runtime: RuntimeDep, limit: Annotated[int, Query(ge=1, le=1000)] = 10
) -> ParkedPage:
    """The largest parked sessions of every tenant, largest first."""
    return _parked(runtime, limit)


@router.get("/v1/peers", tags=["dashboard"], dependencies=_GUARD, responses=_ERRORS)
async def list_peers(
    runtime: RuntimeDep,
    request: Request,
    since: Since = -3600.0,
    step: Step = None,
) -> PeersResponse:
    """This host and every configured peer: figures now and HBM reclaimed over time.

    Peers are asked in parallel with ``dashboard.peer_timeout_s``; one that does not
    answer in time, refuses, or answers with an error is ``"up": false`` with the reason
    and no figures. They are asked with the caller's own bearer token (give every host
    the same operator token); a peer that refuses it is down with ``HTTP 401``.
    """
    return await _peers(runtime, since, step, request.headers.get("authorization"))


# ---- what the routes answer -----------------------------------------------------------------


def _window(since: float, until: float | None) -> tuple[float, float, float]:
    now = time.time()
    start = now + since if since < 0 else since
    end = now if until is None else (now + until if until < 0 else until)
    # A window that ends before it starts holds no sample: an empty answer, not an error
    # (the spec allows any finite since and until).
    start = min(start, end)
    return now, start, end


def _history(
    runtime: Runtime, since: float, until: float | None, step: float | None
) -> HistoryResponse:
    now, start, end = _window(since, until)
    dashboard = runtime.settings.dashboard
    step_s, samples = runtime.sampler.history(start, end, step, MAX_POINTS)
    if start >= end:  # a window that ends where (or before) it starts holds nothing
        samples = []
    return HistoryResponse(
        host=host_label(runtime.settings),
        now=now,
        since=start,
        until=end,
        interval_s=dashboard.sample_interval_s,
        refresh_s=dashboard.refresh_s,
        retention_h=dashboard.retention_h,
        step_s=step_s,
        samples=[HistorySample.model_validate(s) for s in samples],
    )


def _latency(runtime: Runtime, window_s: float) -> LatencyResponse:
    """Latency and bandwidth from the events of the last ``window_s`` seconds."""
    now = time.time()
    figures = runtime.sampler.store.window_figures(now - window_s, now)
    return LatencyResponse(
        window_s=window_s,
        since=now - window_s,
        until=now,
        pause=TransferLatency(
            count=figures["pauses"],
            p50_ms=figures["pause_p50_ms"],
            p99_ms=figures["pause_p99_ms"],
            bytes=figures["bytes_parked"],
            bytes_per_s=bandwidth(figures["bytes_parked"], figures["park_ms"]),
        ),
        resume=TransferLatency(
            count=figures["resumes"] + figures["recomputes"],
            p50_ms=figures["resume_p50_ms"],
            p99_ms=figures["resume_p99_ms"],
            bytes=figures["bytes_restored"],
            bytes_per_s=bandwidth(figures["bytes_restored"], figures["restore_ms"]),
        ),
        recomputes=figures["recomputes"],
        restore_failures=figures["restore_failures"],
    )


def _parked(runtime: Runtime, limit: int) -> ParkedPage:
    """Every tenant's parked sessions, counted; the ``limit`` largest listed."""
    parked = [r for r in runtime.parking.live_sessions() if r.state == State.PARKED]
    parked.sort(key=lambda r: (-r.kv_bytes, r.paused_at or 0.0, r.tenant, r.session_id))
    return ParkedPage(
        count=len(parked),
        bytes=sum(r.kv_bytes for r in parked),
        sessions=[ParkedSession.model_validate(r, from_attributes=True) for r in parked[:limit]],
    )


async def _peers(
    runtime: Runtime, since: float, step: float | None, authorization: str | None = None
) -> PeersResponse:
    dashboard = runtime.settings.dashboard
    _window(since, None)  # 422 on a bad window before asking anyone
    own_host, own_history = await asyncio.gather(
        run_in_threadpool(runtime.host_snapshot),
        run_in_threadpool(_history, runtime, since, None, step),
    )
    hosts = [
        PeerHost(
            name=own_history.host,
            url=None,
            self=True,
            up=True,
            error=None,
            host=own_host,
            history=_series(own_history.samples),
        )
    ]
    if dashboard.peers:
        timeout = httpx.Timeout(dashboard.peer_timeout_s)
        params: dict[str, float] = {"since": since}
        if step is not None:
            params["step"] = step
        headers = {"Authorization": authorization} if authorization else None
        async with httpx.AsyncClient(
            timeout=timeout, follow_redirects=False, headers=headers
        ) as client:
            hosts += await asyncio.gather(
                *(
                    _ask_peer(client, peer.rstrip("/"), params, dashboard.peer_timeout_s)
                    for peer in dashboard.peers
                )
            )
    return PeersResponse(timeout_s=dashboard.peer_timeout_s, hosts=hosts)


def _series(samples: Iterable[object]) -> list[PeerSample]:
    """The fields of each sample the per-host chart uses (keeps the peers answer small).

    ``samples`` are ours (models) or a peer's (parsed JSON); ValidationError when one is
    not a sample.
    """
    return [PeerSample.model_validate(s, from_attributes=True) for s in samples]


async def _ask_peer(
    client: httpx.AsyncClient, url: str, params: dict[str, float], timeout_s: float
) -> PeerHost:
    down = PeerHost(
        name=url.partition("://")[2] or url,
        url=url,
        self=False,
        up=False,
        error=None,
        host=None,
        history=None,
    )
    try:
        # The whole exchange, not just each phase of it, fits in twice the timeout.
        async with asyncio.timeout(2 * timeout_s):
            host, history = await asyncio.gather(
                client.get(f"{url}/v1/host"),
                client.get(f"{url}/v1/host/history", params=params),
                return_exceptions=True,
            )
    except TimeoutError:
        return down.model_copy(update={"error": f"no answer within {2 * timeout_s:g}s"})
    if isinstance(host, BaseException):
        return down.model_copy(update={"error": _describe(host)})
    if host.status_code != 200:
        return down.model_copy(update={"error": f"/v1/host answered HTTP {host.status_code}"})
    try:
        snapshot = HostSnapshot.model_validate(host.json())
    except ValueError:  # not JSON, or JSON that is no host snapshot (ValidationError)
        return down.model_copy(update={"error": "/v1/host: not an agentpark /v1/host answer"})
    entry = down.model_copy(update={"up": True, "host": snapshot})
    if isinstance(history, BaseException):
        entry.history_error = _describe(history)
    elif history.status_code != 200:
        entry.history_error = f"/v1/host/history answered HTTP {history.status_code}"
    else:
        try:
            past = history.json()
            entry.history = _series(past.get("samples", []))
            entry.name = str(past.get("host") or entry.name)
        except ValidationError:
            entry.history_error = "/v1/host/history: not an agentpark history answer"
        except (ValueError, AttributeError):
            entry.history_error = "/v1/host/history: not JSON"
    return entry


def _describe(exc: BaseException) -> str:
    kind = None
    if isinstance(exc, httpx.ConnectTimeout):
        kind = "connect timed out"
    elif isinstance(exc, httpx.ConnectError):
        kind = "connection refused or unreachable"
    elif isinstance(exc, httpx.TimeoutException):
        kind = "no answer in time"
    detail = str(exc) or type(exc).__name__
    return f"{kind}: {detail}" if kind else f"{type(exc).__name__}: {detail}"
