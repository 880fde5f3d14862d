"""A counting wrapper of TPU Sync's real KVCacheManager, for the tests that use the wheel."""

from __future__ import annotations

from typing import Any

__all__ = ["CountingManager"]


class CountingManager:
    """The real KVCacheManager, with every d2h/h2d call counted on the way through."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls: list[tuple[str, list[int], list[int], list[int] | None]] = []

    def d2h(self, src: list[int], dst: list[int], sizes: list[int] | None = None) -> Any:
        self.calls.append(("d2h", src, dst, sizes))
        return self.real.d2h(src, dst, sizes)

    def h2d(self, src: list[int], dst: list[int], sizes: list[int] | None = None) -> Any:
        self.calls.append(("h2d", src, dst, sizes))
        return self.real.h2d(src, dst, sizes)
