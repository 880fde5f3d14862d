"""Which copy loop a chunk runs, from the settings and the arrays; and the hash thread's job.

The rules, in order:

* a checksummed copy of more than one span with ``dma.hash_thread`` on, whose hash thread
  is free, runs numpy a span at a time with the hash on that thread (hash_thread.SpanLoop);
  a busy thread (another copy has it) means fused hashing: waiting could deadlock (the
  other copy's next chunk needs the engine lock this one holds);
* else the native kernel (native_loop) where ``dma.native_copy`` is on, the kernel is
  built and it takes every array pair (rows of whole 64-byte stripes);
* else numpy (numpy_loop).

A restore also chooses between writing in place and XLA's donated writes per chunk
(agentpark.dma.host_copy.restore): that depends on the pool arrays as they are then.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentpark.blocks import PoolGeometry
from agentpark.dma import native
from agentpark.dma.host_copy.hash_thread import HashJob, PieceHasher, SpanLoop
from agentpark.dma.host_copy.native_loop import NativeLoop, takes
from agentpark.dma.host_copy.numpy_loop import NumpyLoop
from agentpark.dma.host_copy.settings import CopySettings
from agentpark.dma.host_copy.strategy import CopyLoop
from agentpark.integrity import piece_blocks

__all__ = ["hash_job", "loop_name", "pick_loop"]


def hash_job(
    settings: CopySettings,
    hasher: PieceHasher,
    geometry: PoolGeometry,
    buffers: Sequence[np.ndarray],
    slots: Sequence[int],
) -> HashJob | None:
    """The hash thread's job for a checksummed copy, or None to hash fused on the copying
    thread: ``dma.hash_thread`` off, a copy of one span or less, or the thread busy."""
    if not settings.hash_thread or len(slots) <= settings.span_blocks(geometry):
        return None
    return hasher.try_start(buffers, slots, piece_blocks(geometry))


def pick_loop(
    settings: CopySettings,
    geometry: PoolGeometry,
    digest: bool,
    job: HashJob | None,
    dsts: Sequence[np.ndarray],
    srcs: Sequence[np.ndarray],
) -> CopyLoop:
    """The loop copying ``srcs`` rows into ``dsts`` for one chunk (``job``: the copy's
    hash-thread job, None when it hashes fused or not at all)."""
    if job is not None:
        return SpanLoop(job, settings.span_blocks(geometry))
    k = piece_blocks(geometry) if digest else 0
    if settings.native_copy and takes(dsts, srcs):
        return NativeLoop(k)
    return NumpyLoop(k)


def loop_name(settings: CopySettings) -> str:
    """Which copy loop pauses and in-place restores run (for the start-up log)."""
    if settings.hash_thread:
        return "numpy + hash thread"
    if settings.native_copy:
        return f"native kernel, {native.available()}"
    return "numpy"
