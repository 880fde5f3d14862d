"""``agentpark status``: a running daemon's /v1/host as readable tables.

It reads operator views (/v1/host, /v1/host/latency, /v1/peers): pass a token with the
``operator`` scope (``--token`` or ``$AGENTPARK_TOKEN``), unless the daemon is on loopback
with no token in its database.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import httpx
from pydantic import ByteSize
from rich.console import Console
from rich.table import Table

from agentpark.client import AgentparkAPIError, AgentparkClient
from agentpark.enums import State
from agentpark.snapshot import HostSnapshot

__all__ = [
    "degraded_line",
    "human_bytes",
    "parked_line",
    "pins_lines",
    "print_status",
    "reclaimed_line",
]

_M = TypeVar("_M")


def human_bytes(n: float) -> str:
    """Binary units, pydantic's way: ``0B``, ``12.0KiB``, ``1.5GiB``."""
    return ByteSize(int(n)).human_readable()


def reclaimed_line(host: HostSnapshot) -> str:
    """Parked bytes and their share of all sessions' KV (in the pool or parked): at most
    100%, unlike a share of the pool, which parked copies in tiers can exceed many times."""
    held = host.reclaimed_bytes + host.pool.used_bytes
    share = host.reclaimed_bytes / held if held else 0.0
    return f"{human_bytes(host.reclaimed_bytes)} ({100 * share:.1f}% of sessions' KV)"


def parked_line(host: HostSnapshot) -> str:
    """How many sessions are parked and how long the oldest has waited (the TTL's clock)."""
    count = host.sessions.get(State.PARKED.value, 0)
    if host.oldest_parked_s is None:
        return f"{count} sessions"
    return f"{count} sessions, oldest untouched {host.oldest_parked_s:.0f} s"


def degraded_line(counts: dict[str, int]) -> str:
    """``slow`` (answered after the budget) apart from the rest (daemon down, refused...)."""
    slow = counts.get("slow", 0) + counts.get("timeout", 0)
    other = sum(counts.values()) - slow
    return f"{slow} slow, {other} other"


def pins_lines(host: HostSnapshot) -> list[tuple[str, str]]:
    """vLLM's pins: held now, ended by cause, and what pins saved beside parks."""
    pins = host.pins
    if pins is None:
        return []
    released = ", ".join(f"{n} {cause}" for cause, n in sorted(pins.released.items())) or "none"
    by_park = max(0, host.counters.prefill_tokens_avoided - pins.tokens_saved)
    answers = pins.turn_ends
    ends = ", ".join(f"{answers.get(a, 0)} {a}" for a in ("pinned", "parked", "dropped", "kept"))
    return [
        ("pinned now", f"{pins.sessions} sessions, {pins.blocks} vLLM blocks"),
        ("pins ended", released),
        (
            "prefill saved by pins / parks",
            f"{pins.tokens_saved} / {by_park} tokens ({human_bytes(pins.bytes_saved)} by pins)",
        ),
        ("turn ends", ends),
    ]


def print_status(url: str, console: Console | None = None, *, token: str | None = None) -> int:
    console = console or Console()
    # Short to connect: a daemon that is not there fails fast; /v1/peers may take a while.
    with AgentparkClient(url, token=token, timeout=httpx.Timeout(30.0, connect=5.0)) as client:
        try:
            host = client.host()
        except AgentparkAPIError as exc:
            if exc.status in (401, 403):
                console.print(
                    f"[red]agentpark daemon at {url} refused: {exc}[/red]\n"
                    "pass a token with the operator scope: --token or $AGENTPARK_TOKEN"
                )
            else:
                console.print(f"[red]agentpark daemon at {url} did not answer: {exc}[/red]")
            return 1
        except httpx.HTTPError as exc:
            console.print(f"[red]agentpark daemon at {url} did not answer: {exc}[/red]")
            return 1
        pool = host.pool

        summary = Table(title=f"agentpark at {url}", show_header=False)
        summary.add_column("what")
        summary.add_column("value", justify="right")
        summary.add_row("ready", "yes" if host.ready else "warming up")
        summary.add_row("dma backend", host.dma_backend)
        summary.add_row(
            "KV pool used",
            f"{pool.used_blocks}/{pool.total_blocks} blocks "
            f"({human_bytes(pool.used_bytes)} of {human_bytes(pool.total_bytes)})",
        )
        summary.add_row("HBM reclaimed (parked now)", reclaimed_line(host))
        summary.add_row(
            "active now",
            f"{host.sessions.get(State.ACTIVE.value, 0)} sessions, "
            f"{host.active_tokens} tokens in the engine",
        )
        summary.add_row("parked now", parked_line(host))
        if host.degraded is not None:
            summary.add_row("vLLM turns served without agentpark", degraded_line(host.degraded))
        for what, line in pins_lines(host):
            summary.add_row(what, line)
        for name, tier in host.tiers.items():
            summary.add_row(
                f"tier {name}",
                f"{human_bytes(tier.used_bytes)} of {human_bytes(tier.capacity_bytes)}",
            )
        console.print(summary)
        _print_headlines(client, console)

    sessions = Table(title="sessions by state")
    sessions.add_column("state")
    sessions.add_column("count", justify="right")
    for state, count in host.sessions.items():
        sessions.add_row(state, str(count))
    console.print(sessions)

    counters = Table(title="since start")
    counters.add_column("counter")
    counters.add_column("value", justify="right")
    for name, value in host.counters.model_dump(exclude_unset=True).items():  # as sent
        if name == "tokens_generated" and host.dma_backend == "external":
            continue  # vLLM generates them: this daemon does not see its output tokens
        shown = human_bytes(value) if name.startswith("bytes") else str(value)
        counters.add_row(name.replace("_", " "), shown)
    console.print(counters)
    return 0


def human_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms / 1e3:.2f} s" if ms >= 1e3 else f"{ms:.2f} ms"


def human_rate(per_s: float | None) -> str:
    if per_s is None:
        return "-"
    for unit in ("B/s", "kB/s", "MB/s", "GB/s"):
        if per_s < 1000 or unit == "GB/s":
            return f"{per_s:.0f} {unit}" if unit == "B/s" else f"{per_s:.2f} {unit}"
        per_s /= 1000
    raise AssertionError("unreachable")


def _optional(ask: Callable[[], _M]) -> _M | None:
    """The answer, or None when this daemon does not have the route (an older one)."""
    try:
        return ask()
    except (httpx.HTTPError, AgentparkAPIError, ValueError):
        return None


def _print_headlines(client: AgentparkClient, console: Console, window_s: float = 900.0) -> None:
    """The dashboard's headline figures: latency, bandwidth, failures, and the peers."""
    latency = _optional(lambda: client.latency(window_s=window_s))
    if latency is not None:
        pause, resume = latency.pause, latency.resume
        table = Table(title=f"last {window_s / 60:.0f} min", show_header=True)
        table.add_column("")
        table.add_column("count", justify="right")
        table.add_column("p50", justify="right")
        table.add_column("p99", justify="right")
        table.add_column("bandwidth", justify="right")
        table.add_row(
            "pause",
            str(pause.count),
            human_ms(pause.p50_ms),
            human_ms(pause.p99_ms),
            human_rate(pause.bytes_per_s),
        )
        table.add_row(
            f"resume ({latency.recomputes} recomputed)",
            str(resume.count),
            human_ms(resume.p50_ms),
            human_ms(resume.p99_ms),
            human_rate(resume.bytes_per_s),
        )
        table.add_row("restore failures", str(latency.restore_failures), "", "", "")
        console.print(table)
    peers = _optional(lambda: client.peers(since=-60))
    if peers is not None and len(peers.hosts) > 1:
        hosts = Table(title="hosts")
        for column in ("host", "status", "HBM reclaimed", "HBM used", "active", "parked"):
            hosts.add_column(column, justify="left" if column in ("host", "status") else "right")
        for entry in peers.hosts:
            view = entry.host
            if entry.up and view is not None:
                hosts.add_row(
                    entry.name,
                    "up",
                    human_bytes(view.reclaimed_bytes),
                    f"{human_bytes(view.pool.used_bytes)} of {human_bytes(view.pool.total_bytes)}",
                    str(view.sessions.get("active", 0)),
                    str(view.sessions.get("parked", 0)),
                )
            else:  # down is not zero: no figures
                hosts.add_row(entry.name, f"[red]down[/red] ({entry.error})", "", "", "", "")
        console.print(hosts)
