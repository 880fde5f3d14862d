"""The restore (h2d): each chunk written in place where the pool allows it, else via XLA.

In place (the default on JAX's CPU platform, agentpark.dma.host_copy.in_place): the
mirror of the pause. The pool arrays are made exclusively XLA's and ready (a donated no-op,
under the engine lock), and the chunk's copy loop writes the tier rows straight into
writable views over their own memory: numpy (one ``np.copyto`` per run consecutive on both
sides, a row scatter for a run of tier slots whose pool ids do not run on) or the native
kernel, the parts of a chunk split over ``copy_threads`` threads. in_place's docstring says
why this is safe.

Through XLA (agentpark.dma.host_copy.xla) when ``in_place`` is off, the pool is one
in_place refuses (not a plain single-device CPU array), or a target id repeats within the
chunk (threads would race on one block). The pool may change between chunks, so each
chunk decides; the observer hears which path each took.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from agentpark.dma.host_copy.in_place import HeldPool, hold
from agentpark.dma.host_copy.observer import CopyObserver
from agentpark.dma.host_copy.run import CopyRun
from agentpark.dma.host_copy.strategy import Chunk
from agentpark.dma.host_copy.xla import XlaWriter
from agentpark.engine.base import EngineAdapter
from agentpark.errors import TransferError
from agentpark.tiers.base import HostTier

__all__ = ["Restorer"]

log = logging.getLogger(__name__)


class Restorer:
    """A transfer's restores; logs once why one went through XLA, and once a pool copy."""

    def __init__(self) -> None:
        self.xla = XlaWriter()
        self._fallback_logged: str | None = None
        self._warned_copied = False

    def restore(
        self,
        run: CopyRun,
        engine: EngineAdapter,
        buffers: Sequence[np.ndarray],
        slots: Sequence[int],
        block_ids: Sequence[int],
    ) -> list[bytes]:
        """The restore, chunk by chunk; the piece digests hashed here (none with the hash
        thread's job)."""
        pieces: list[bytes] = []
        for lo, hi in run.chunks(len(slots)):
            ids, chunk_slots = block_ids[lo:hi], slots[lo:hi]
            with engine.lock:
                held = self._hold(run, engine, ids)
                if isinstance(held, HeldPool):
                    try:
                        part = _in_place(run, held, buffers, chunk_slots, ids, lo)
                    except Exception as exc:
                        raise TransferError(f"in-place restore failed: {exc}") from exc
                    finally:
                        held.release()
                    held.check(engine)
                else:
                    part = self.xla.restore_chunk(run, engine, buffers, chunk_slots, ids, lo)
                pieces.extend(part)
            run.chunk_done(hi - lo)
        return pieces

    def warmup(
        self, engine: EngineAdapter, tier: HostTier, chunk_blocks: int, in_place: bool
    ) -> None:
        """Compile both XLA write paths, and the in-place path's no-op, writing nothing.

        Without this, the first restore of each new size pays its compile (tens of ms) in
        the resume it delays.
        """
        if tier.capacity_blocks == 0:
            return
        with engine.lock:
            self.xla.warmup(engine, tier, chunk_blocks)
            if in_place:  # and the in-place path's donated no-op, for this pool
                held = hold(engine)
                if isinstance(held, HeldPool):
                    held.release()

    def _hold(self, run: CopyRun, engine: EngineAdapter, ids: Sequence[int]) -> HeldPool | None:
        """The pool held for an in-place write of ``ids``, or None to write through XLA."""
        observer: CopyObserver = run.observer
        why = "host_copy.in_place is off"
        if run.settings.in_place:
            if len(set(ids)) != len(ids):
                why = "a block id repeats within the chunk"
            else:
                held = hold(engine)
                if isinstance(held, HeldPool):
                    observer.on_restore_path("in place")
                    if held.copied and not self._warned_copied:
                        self._warned_copied = True
                        log.warning(
                            "host_copy: the pool's buffer was held by something else (a live "
                            "np.asarray view, a dlpack alias, host memory it was made over), so "
                            "XLA copied the whole pool before the restore; XLA's own donated "
                            "writes copy it the same way: drop such views under the engine lock"
                        )
                    return held
                why = held
        observer.on_restore_path("xla")
        if run.settings.in_place and why != self._fallback_logged:
            self._fallback_logged = why
            log.info("host_copy: restoring through XLA, not in place: %s", why)
        return None


def _in_place(
    run: CopyRun,
    held: HeldPool,
    buffers: Sequence[np.ndarray],
    slots: Sequence[int],
    ids: Sequence[int],
    offset: int,
) -> list[bytes]:
    """One chunk into the held pool: the pause's loop the other way round; the fused
    piece digests, in order."""
    loop = run.loop(held.views, buffers)
    chunk = Chunk(held.views, buffers, np.asarray(ids, dtype=np.intp), slots, offset)
    return run.copy(loop.scatter(chunk), len(ids), loop.unit)
