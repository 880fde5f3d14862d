"""One import's reserved slots and the blocks landed in them, verified on arrival.

Blocks land two ways: an HTTP chunk (a body, checked whole before any of it is written:
:meth:`Landing.take_chunk`) or the data port (read straight into the slots' rows of every
pool array, no buffer, then checked: :meth:`Landing.take_stream`). Either way only a
block whose bytes hash to its manifest digest counts as received; a slot is pending (never
shared or read) until the commit seals it, so a bad block's bytes in it are harmless and
are overwritten by the next try.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np
import xxhash

from agentpark.errors import InvalidRequestError
from agentpark.integrity import BLOCK_SCHEME
from agentpark.moving.blockio import wire_digest, write_blocks
from agentpark.moving.wire import MoveManifest
from agentpark.tiers.base import HostTier
from agentpark.tiers.slots import Reservation

__all__ = ["Landing", "Reader", "flat_rows"]

Reader = Callable[[list[memoryview]], None]
"""Fills every buffer in turn from the connection, or raises (closed, timed out)."""


def flat_rows(tier: HostTier) -> list[tuple[memoryview, int]] | None:
    """Each pool array of ``tier`` as one flat byte view and its row size (a slot's bytes
    of that array are ``view[slot * n:(slot + 1) * n]``); None when one is not contiguous."""
    out: list[tuple[memoryview, int]] = []
    for buf in tier.buffers():
        if not buf.flags.c_contiguous:
            return None
        flat = buf.reshape(-1).view(np.uint8)
        out.append((memoryview(flat.data), buf[0].nbytes))
    return out


@dataclass
class Landing:
    manifest: MoveManifest
    tier: HostTier
    reservation: Reservation
    keys: list[Hashable | None]
    received: set[int] = field(default_factory=set)
    written: int = 0
    open: bool = True  # False once aborted: its slots may be another's; nothing lands
    touched: float = field(default_factory=time.monotonic)
    started: float = field(default_factory=time.perf_counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def owner(self) -> tuple[str, str]:
        return ("move", self.manifest.move_id)

    def missing(self) -> list[int]:
        return [i for i in self.reservation.to_copy if i not in self.received]

    def take_chunk(self, indices: Sequence[int], body: bytes | memoryview, block: int) -> None:
        """An HTTP chunk: all or nothing, every block checked before any is written (422)."""
        view = memoryview(body)
        digests = self.manifest.digests
        with self.lock:
            self._check_open()
            fresh = set(self.reservation.to_copy)
            for pos, i in enumerate(indices):
                if i not in fresh:
                    raise InvalidRequestError(f"block {i} is not one this move needs")
                got = wire_digest(view[pos * block : (pos + 1) * block])
                if got != digests[i]:
                    raise InvalidRequestError(
                        f"block {i} failed its checksum on arrival ({got} != {digests[i]}); "
                        "nothing of this chunk was kept",
                        block=i,
                    )
            # A retry of a chunk that landed: what was written is written once.
            at = [pos for pos, i in enumerate(indices) if i not in self.received]
            new = [indices[pos] for pos in at]
            write_blocks(self.tier, [self.reservation.slots[i] for i in new], view, at)
            self._landed(new)

    def take_stream(
        self, indices: Sequence[int], rows: list[tuple[memoryview, int]], read: Reader
    ) -> int | None:
        """Blocks read off a data connection straight into their slots, then checked.
        Returns the index of the first block that failed its digest (the ones before it
        count), or None when all of them are good."""
        slots, digests = self.reservation.slots, self.manifest.digests
        with self.lock:
            self._check_open()
            fresh = set(self.reservation.to_copy)
            if any(i not in fresh or i in self.received for i in indices):
                raise InvalidRequestError("a block this move does not need (or has)")
            views = [view[slots[i] * n : (slots[i] + 1) * n] for i in indices for view, n in rows]
            read(views)
            good: list[int] = []
            bad = None
            per = len(rows)
            for pos, i in enumerate(indices):
                digest = xxhash.xxh3_64()
                for view in views[pos * per : (pos + 1) * per]:
                    digest.update(view)
                if f"{BLOCK_SCHEME}:{digest.hexdigest()}" != digests[i]:
                    bad = i
                    break
                good.append(i)
            self._landed([i for i in good if i not in self.received])
            return bad

    def close(self) -> None:
        """Nothing lands any more (waits for a landing in progress)."""
        with self.lock:
            self.open = False

    def _check_open(self) -> None:
        if not self.open:
            raise InvalidRequestError(
                f"move {self.manifest.move_id} was given up here: begin it again"
            )

    def _landed(self, new: list[int]) -> None:
        self.received.update(new)
        self.written += len(new)
        self.touched = time.monotonic()
