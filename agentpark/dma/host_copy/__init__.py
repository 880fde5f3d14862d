"""host_copy: the CPU backend, where the pool already lives in host memory.

A pause gathers pool blocks straight into the preallocated tier buffer; a restore writes
tier rows straight into the pool's own memory (in place) or through XLA's donated writes.
Copies go in chunks under the engine lock, so other sessions keep decoding while a large
session moves; a checksum (``digest=True``, agentpark.integrity) is taken as the bytes go.

=================  ===========================================================================
module             its one job
=================  ===========================================================================
transfer           :class:`HostCopyTransfer`, the face: settings, threads, observer
settings           the settings one copy runs with; chunks and parts
selector           which copy loop a chunk runs; the hash thread's job or fused hashing
strategy           the copy-loop protocol (:class:`CopyLoop`) and a chunk's rows
native_loop        copy and hash in one pass with the native kernel (``dma.native_copy``)
numpy_loop         numpy's copies, each piece hashed just before (from cache)
hash_thread        numpy's copies with the hash on one more thread (``dma.hash_thread``)
pause              the pause (d2h), chunk by chunk
restore            the restore (h2d): in place or through XLA, per chunk
in_place           the pool held for an in-place write, and why that is safe
xla                the restore through XLA's donated writes; the warm-up compiles
run                one copy's context; the checksum fused or on the hash thread
workers            the ``dma.copy_threads`` worker threads
observer           what a copy tells whoever watches it (chunks, restore paths)
=================  ===========================================================================

Without the kernel one thread cannot hide the hash: it costs its compute time from cache
(xxh3 ~4x memcpy speed there); see the README's Benchmarks for what each path measures.
"""

from __future__ import annotations

from agentpark.dma.host_copy.observer import (
    CopyObserver,
    LastRestorePath,
    NullObserver,
    RestorePath,
)
from agentpark.dma.host_copy.settings import (
    DEFAULT_CHUNK_BYTES,
    HASH_SPAN_BYTES,
    MAX_COPY_THREADS,
    CopySettings,
)
from agentpark.dma.host_copy.transfer import HostCopyTransfer

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "HASH_SPAN_BYTES",
    "MAX_COPY_THREADS",
    "CopyObserver",
    "CopySettings",
    "HostCopyTransfer",
    "LastRestorePath",
    "NullObserver",
    "RestorePath",
]
