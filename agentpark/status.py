"""``agentpark status``: a running daemon's /v1/host as readable tables."""

from __future__ import annotations

from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

__all__ = ["human_bytes", "print_status"]


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def print_status(url: str, console: Console | None = None) -> int:
    console = console or Console()
    try:
        response = httpx.get(f"{url.rstrip('/')}/v1/host", timeout=5.0)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        console.print(f"[red]agentpark daemon at {url} did not answer: {exc}[/red]")
        return 1
    host: dict[str, Any] = response.json()
    pool = host["pool"]

    summary = Table(title=f"agentpark at {url}", show_header=False)
    summary.add_column("what")
    summary.add_column("value", justify="right")
    summary.add_row("ready", "yes" if host["ready"] else "warming up")
    summary.add_row("dma backend", host["dma_backend"])
    summary.add_row(
        "KV pool used",
        f"{pool['used_blocks']}/{pool['total_blocks']} blocks "
        f"({human_bytes(pool['used_bytes'])} of {human_bytes(pool['total_bytes'])})",
    )
    summary.add_row("HBM reclaimed (parked now)", human_bytes(host["reclaimed_bytes"]))
    for name, tier in host["tiers"].items():
        summary.add_row(
            f"tier {name}",
            f"{human_bytes(tier['used_bytes'])} of {human_bytes(tier['capacity_bytes'])}",
        )
    console.print(summary)

    sessions = Table(title="sessions by state")
    sessions.add_column("state")
    sessions.add_column("count", justify="right")
    for state, count in host["sessions"].items():
        sessions.add_row(state, str(count))
    console.print(sessions)

    counters = Table(title="since start")
    counters.add_column("counter")
    counters.add_column("value", justify="right")
    for name, value in host["counters"].items():
        shown = human_bytes(value) if name.startswith("bytes") else str(value)
        counters.add_row(name.replace("_", " "), shown)
    console.print(counters)
    return 0
