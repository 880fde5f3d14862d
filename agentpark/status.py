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
    share = host["reclaimed_bytes"] / pool["total_bytes"] if pool["total_bytes"] else 0.0
    summary.add_row(
        "HBM reclaimed (parked now)",
        f"{human_bytes(host['reclaimed_bytes'])} ({100 * share:.1f}% of the pool)",
    )
    for name, tier in host["tiers"].items():
        summary.add_row(
            f"tier {name}",
            f"{human_bytes(tier['used_bytes'])} of {human_bytes(tier['capacity_bytes'])}",
        )
    console.print(summary)
    _print_headlines(url, console)

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


def _get(url: str, path: str, timeout: float) -> Any | None:
    """A JSON answer, or None when this daemon does not have the route (an older one)."""
    try:
        response = httpx.get(f"{url.rstrip('/')}{path}", timeout=timeout)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def _print_headlines(url: str, console: Console, window_s: float = 900.0) -> None:
    """The dashboard's headline figures: latency, bandwidth, failures, and the peers."""
    latency = _get(url, f"/v1/host/latency?window_s={window_s:g}", 5.0)
    if latency is not None:
        pause, resume = latency["pause"], latency["resume"]
        table = Table(title=f"last {window_s / 60:.0f} min", show_header=True)
        table.add_column("")
        table.add_column("count", justify="right")
        table.add_column("p50", justify="right")
        table.add_column("p99", justify="right")
        table.add_column("bandwidth", justify="right")
        table.add_row(
            "pause",
            str(pause["count"]),
            human_ms(pause["p50_ms"]),
            human_ms(pause["p99_ms"]),
            human_rate(pause["bytes_per_s"]),
        )
        table.add_row(
            f"resume ({latency['recomputes']} recomputed)",
            str(resume["count"]),
            human_ms(resume["p50_ms"]),
            human_ms(resume["p99_ms"]),
            human_rate(resume["bytes_per_s"]),
        )
        table.add_row("restore failures", str(latency["restore_failures"]), "", "", "")
        console.print(table)
    peers = _get(url, "/v1/peers?since=-60", 30.0)
    if peers is not None and len(peers["hosts"]) > 1:
        hosts = Table(title="hosts")
        for column in ("host", "status", "HBM reclaimed", "HBM used", "active", "parked"):
            hosts.add_column(column, justify="left" if column in ("host", "status") else "right")
        for entry in peers["hosts"]:
            view = entry["host"]
            if entry["up"] and view is not None:
                hosts.add_row(
                    entry["name"],
                    "up",
                    human_bytes(view["reclaimed_bytes"]),
                    f"{human_bytes(view['pool']['used_bytes'])} of "
                    f"{human_bytes(view['pool']['total_bytes'])}",
                    str(view["sessions"].get("active", 0)),
                    str(view["sessions"].get("parked", 0)),
                )
            else:  # down is not zero: no figures
                hosts.add_row(entry["name"], f"[red]down[/red] ({entry['error']})", "", "", "", "")
        console.print(hosts)
