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
"""

from __future__ import annotations

import asyncio
import time
from functools import cache
from importlib import resources
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse
from starlette.concurrency import run_in_threadpool

from agentpark.api.deps import RuntimeDep
from agentpark.api.host import get_host
from agentpark.errors import InvalidRequestError
from agentpark.history import transfer_figures
from agentpark.runtime import Runtime, host_label

__all__ = ["router"]

router = APIRouter()

MAX_POINTS = 2000
WEEK_S = 7 * 24 * 3600.0
# Fields of a peer's history the per-host chart uses (keeps the peers answer small).
PEER_SERIES = ("at", "step_s", "reclaimed_bytes", "pool_used_bytes", "pool_total_bytes")

Since = Annotated[
    float,
    Query(description="epoch seconds, or negative: that many seconds before now"),
]
Until = Annotated[
    float | None, Query(description="epoch seconds, or negative: before now; default now")
]
Step = Annotated[
    float | None,
    Query(ge=0.0, le=WEEK_S, description="seconds per point (merged on the fly); default raw"),
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


def _window(since: float, until: float | None) -> tuple[float, float, float]:
    now = time.time()
    start = now + since if since < 0 else since
    end = now if until is None else (now + until if until < 0 else until)
    if start >= end:
        raise InvalidRequestError("since must be before until", since=start, until=end)
    return now, start, end


def _history(
    runtime: Runtime, since: float, until: float | None, step: float | None
) -> dict[str, Any]:
    now, start, end = _window(since, until)
    dashboard = runtime.settings.dashboard
    step_s, samples = runtime.sampler.history(start, end, step, MAX_POINTS)
    return {
        "host": host_label(runtime.settings),
        "now": now,
        "since": start,
        "until": end,
        "interval_s": dashboard.sample_interval_s,
        "refresh_s": dashboard.refresh_s,
        "retention_h": dashboard.retention_h,
        "step_s": step_s,
        "samples": samples,
    }


@router.get("/v1/host/history", tags=["host"])
def get_history(
    runtime: RuntimeDep, since: Since = -3600.0, until: Until = None, step: Step = None
) -> dict[str, Any]:
    """Host samples in a window, oldest first (see agentpark.history for each field)."""
    return _history(runtime, since, until, step)


@router.get("/v1/host/latency", tags=["host"])
def get_latency(
    runtime: RuntimeDep,
    window_s: Annotated[float, Query(gt=0.0, le=WEEK_S)] = 900.0,
) -> dict[str, Any]:
    """Pause and resume latency p50/p99 and bandwidth over the last ``window_s`` seconds."""
    now = time.time()
    figures = transfer_figures(runtime.sampler.store.events_between(now - window_s, now))

    def rate(nbytes: int, ms: float) -> float | None:
        return nbytes / (ms / 1e3) if ms > 0 and nbytes > 0 else None

    return {
        "window_s": window_s,
        "since": now - window_s,
        "until": now,
        "pause": {
            "count": figures["pauses"],
            "p50_ms": figures["pause_p50_ms"],
            "p99_ms": figures["pause_p99_ms"],
            "bytes": figures["bytes_parked"],
            "bytes_per_s": rate(figures["bytes_parked"], figures["park_ms"]),
        },
        "resume": {
            "count": figures["resumes"] + figures["recomputes"],
            "p50_ms": figures["resume_p50_ms"],
            "p99_ms": figures["resume_p99_ms"],
            "bytes": figures["bytes_restored"],
            "bytes_per_s": rate(figures["bytes_restored"], figures["restore_ms"]),
        },
        "recomputes": figures["recomputes"],
        "restore_failures": figures["restore_failures"],
    }


@router.get("/v1/host/parked", tags=["host"])
def get_parked(
    runtime: RuntimeDep, limit: Annotated[int, Query(ge=1, le=1000)] = 10
) -> dict[str, Any]:
    """The largest parked sessions of every tenant, largest first."""
    parked = [r for r in runtime.parking.live_sessions() if r.state == "parked"]
    parked.sort(key=lambda r: (-r.kv_bytes, r.paused_at or 0.0, r.tenant, r.session_id))
    return {
        "count": len(parked),
        "bytes": sum(r.kv_bytes for r in parked),
        "sessions": [
            {
                "tenant": r.tenant,
                "session_id": r.session_id,
                "tier": r.tier,
                "kv_bytes": r.kv_bytes,
                "kv_blocks": r.kv_blocks,
                "num_tokens": r.num_tokens,
                "paused_at": r.paused_at,
                "tool": r.tool,
                "expected_resume_at": r.expected_resume_at,
            }
            for r in parked[:limit]
        ],
    }


@router.get("/v1/peers", tags=["dashboard"])
async def get_peers(
    runtime: RuntimeDep, since: Since = -3600.0, step: Step = None
) -> dict[str, Any]:
    """This host and every configured peer: figures now and HBM reclaimed over time.

    Peers are asked in parallel with ``dashboard.peer_timeout_s``; one that does not
    answer in time, refuses, or answers with an error is ``"up": false`` with the reason
    and no figures.
    """
    dashboard = runtime.settings.dashboard
    _window(since, None)  # 422 on a bad window before asking anyone
    own_host, own_history = await asyncio.gather(
        run_in_threadpool(get_host, runtime),
        run_in_threadpool(_history, runtime, since, None, step),
    )
    hosts: list[dict[str, Any]] = [
        {
            "name": own_history["host"],
            "url": None,
            "self": True,
            "up": True,
            "error": None,
            "host": own_host,
            "history": _series(own_history),
        }
    ]
    if dashboard.peers:
        timeout = httpx.Timeout(dashboard.peer_timeout_s)
        params: dict[str, float] = {"since": since}
        if step is not None:
            params["step"] = step
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
            hosts += await asyncio.gather(
                *(
                    _ask_peer(client, peer.rstrip("/"), params, dashboard.peer_timeout_s)
                    for peer in dashboard.peers
                )
            )
    return {"timeout_s": dashboard.peer_timeout_s, "hosts": hosts}


def _series(history: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: s.get(k) for k in PEER_SERIES} for s in history.get("samples", [])]


async def _ask_peer(
    client: httpx.AsyncClient, url: str, params: dict[str, float], timeout_s: float
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": url.partition("://")[2] or url,
        "url": url,
        "self": False,
        "up": False,
        "error": None,
        "host": None,
        "history": None,
    }
    try:
        # The whole exchange, not just each phase of it, fits in twice the timeout.
        async with asyncio.timeout(2 * timeout_s):
            host, history = await asyncio.gather(
                client.get(f"{url}/v1/host"),
                client.get(f"{url}/v1/host/history", params=params),
                return_exceptions=True,
            )
    except TimeoutError:
        entry["error"] = f"no answer within {2 * timeout_s:g}s"
        return entry
    if isinstance(host, BaseException):
        entry["error"] = _describe(host)
        return entry
    if host.status_code != 200:
        entry["error"] = f"/v1/host answered HTTP {host.status_code}"
        return entry
    try:
        body = host.json()
        if not isinstance(body, dict) or "reclaimed_bytes" not in body:
            raise ValueError("not an agentpark /v1/host answer")
    except ValueError as exc:
        entry["error"] = f"/v1/host: {exc}"
        return entry
    entry["up"], entry["host"] = True, body
    if not isinstance(history, BaseException) and history.status_code == 200:
        try:
            past = history.json()
            entry["history"] = _series(past)
            entry["name"] = str(past.get("host") or entry["name"])
        except (ValueError, AttributeError):
            entry["history_error"] = "/v1/host/history: not JSON"
    else:
        entry["history_error"] = (
            _describe(history)
            if isinstance(history, BaseException)
            else f"/v1/host/history answered HTTP {history.status_code}"
        )
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
