"""Waiting for what another thread or process makes true, without sleeping blind."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["wait_until"]


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait for a condition another thread makes true; fail loudly at the deadline."""
    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s")
        tick.wait(0.005)
