"""Learned tool pauses: how long each tool really keeps an agent waiting.

Each observation is an event (kind ``tool_return``, ``detail`` the tool, ``duration_ms`` the
pause) in SQLite, written by parking when a session that paused for a tool is touched
again; this keeps a window per tool in memory, loaded from those events at start. The
estimate is a quantile of the window (the median by default): robust to the odd tool call
that hangs for minutes. Config priors stand in until a tool has been seen.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from agentpark.config import PolicySettings
from agentpark.store.models import EventRow

__all__ = ["ToolStats"]


class ToolStats:
    def __init__(self, window: int) -> None:
        self._window = window
        self._seen: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def observe(self, tool: str, seconds: float) -> None:
        with self._lock:
            self._seen.setdefault(tool, deque(maxlen=self._window)).append(seconds)

    def on_event(self, event: EventRow) -> None:
        """Event listener: learn from every tool_return event."""
        if event.kind == "tool_return" and event.detail and event.duration_ms is not None:
            self.observe(event.detail, event.duration_ms / 1e3)

    def load(self, events: list[EventRow]) -> None:
        """Seed from stored tool_return events, oldest first."""
        for event in events:
            self.on_event(event)

    def summary(self) -> dict[str, int]:
        """Observations per tool seen so far."""
        with self._lock:
            return {tool: len(seen) for tool, seen in self._seen.items()}

    def expected(self, tool: str | None, cfg: PolicySettings) -> tuple[float | None, str]:
        """The expected pause for ``tool`` and where the figure comes from."""
        if tool is None:
            return None, "no tool named"
        with self._lock:
            seen = list(self._seen.get(tool, ()))
        if seen:
            value = float(np.quantile(seen, cfg.tool_quantile))
            return value, f"learned: q{cfg.tool_quantile:g} of {len(seen)} {tool} pauses"
        prior = cfg.tools.get(tool)
        if prior is not None:
            return prior.expected_pause_s, f"configured prior for {tool}"
        return None, f"tool {tool} never seen and has no prior"
