"""What a host_copy transfer tells whoever watches it: chunks done, restore paths taken.

Why an observer passed in: the copy is one blocking call that runs for a second or more on
a large session, and some callers need to see inside it without the transfer knowing who
they are: a progress bar (bytes per chunk), the transfer bench (which restore path ran),
tests that hold a copy open between chunks to check that other sessions are not blocked.
The transfer calls :class:`CopyObserver`'s methods; :class:`NullObserver` is the default.
"""

from __future__ import annotations

from typing import Literal, Protocol

__all__ = ["CopyObserver", "LastRestorePath", "NullObserver", "RestorePath"]

RestorePath = Literal["in place", "xla"]
"""How a restore chunk was written: numpy into the pool's own memory, or XLA's donated
writes (agentpark.dma.host_copy.restore says when each is taken)."""


class CopyObserver(Protocol):
    """Callbacks from inside a copy. They run on the copying thread: keep them short."""

    def on_chunk(self, nbytes: int) -> None:
        """A chunk of ``nbytes`` is copied; called outside the engine lock, so it may wait
        (other sessions keep decoding meanwhile)."""
        ...

    def on_restore_path(self, path: RestorePath) -> None:
        """The next restore chunk is written this way; called under the engine lock."""
        ...


class NullObserver:
    """Watches nothing: the default."""

    def on_chunk(self, nbytes: int) -> None:
        """Nothing to report to."""

    def on_restore_path(self, path: RestorePath) -> None:
        """Nothing to report to."""


class LastRestorePath(NullObserver):
    """Remembers the path of the last restore chunk (None before any): the bench reports
    which path the session core's restores took."""

    def __init__(self) -> None:
        self.last: RestorePath | None = None

    def on_restore_path(self, path: RestorePath) -> None:
        self.last = path
