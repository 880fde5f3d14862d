"""``agentpark bench transfer``: pause/restore GB/s through the real control plane.

For each size, one session holding that much KV is paused to one tier (``dram``, ``shm`` or
``disk``) and resumed through :meth:`agentpark.parking.SessionCore.pause` /
:meth:`~agentpark.parking.SessionCore.resume` (SQLite row and event writes included), ``repeats``
times. Each repeat is interleaved with a plain ``np.copyto`` between two preallocated,
pre-faulted buffers of the same size, so machine noise hits the reference and the measurement
alike; the table reports medians, min-max spreads and the ratio of each direction to the
reference (DESIGN.md section 10). For the disk tier each repeat also writes (``os.pwrite`` +
``os.fsync``) and reads back (``os.preadv``) a plain preallocated file of the same size on the
same filesystem, and pause and restore are judged against those.

The first table's rows run with checksums off. In the same repeats the session is paused and
resumed again with the tier checksummed (``integrity.tiers``): host_copy then hashes each
1 MiB piece as it copies it (see agentpark.integrity), and the second table says what that
adds; :func:`agentpark.integrity.checksum` over the parked copy is also timed on its own.
The third table times the copy alone (``HostCopyTransfer.d2h``/``h2d`` between the session's
blocks and spare tier slots, checksum off and on), without the SQLite bookkeeping.

``copy_threads`` (``--copy-threads``) is host_copy's ``dma.copy_threads``. With more than
one, every ratio is also printed against an ``np.copyto`` split over that many threads,
timed in the same repeat: how close the copy comes to what the memory allows, not only to
one core's memcpy.

``hash_thread`` (``--hash-thread``) is host_copy's ``dma.hash_thread`` (the checksum hashed on
a second thread, dma.host_copy.hash_thread) for every checksummed operation. The copy-alone
table also times the other checksum path in the same repeats (the hash thread without the
flag, the fused one-thread hash with it), and a fourth table puts the two side by side:
an A/B under the same machine noise.

``native_copy`` (``--no-native-copy`` turns it off) is host_copy's ``dma.native_copy``: pauses
and in-place restores through the native kernel (agentpark.dma.native: copy and xxh3 in one
pass). Where the kernel is built, the copy alone is also timed through the other copy loop
(numpy and xxhash, or the kernel) in the same repeats, and a last table puts the two side by
side.

Sessions get their KV synthetically (no model step is compiled for a huge context): seeded
random pages are written into the pool by the DMA core itself, from a scratch DRAM tier, and
the session is then handed those blocks (see :meth:`InProcessDriver.adopt_kv`). Once per
size, before and after the timed repeats, the pool rows after a resume are compared with
the parked bytes; any difference makes the bench exit 1.

``backend="tpu_sync"`` (``--backend tpu_sync``, dram tier only) runs the same sizes through
TPU Sync's KVCacheManager (the real wheel; on JAX's CPU platform it is allowed for the bench
as if ``dma.tpu_sync_on_cpu`` were set) into a slot-only tier whose bytes TPU Sync holds; its
ratios are to the same np.copyto reference. Checksum off only: agentpark cannot read TPU
Sync's host blocks, so there is no checksum-on pause/resume, no checksum table and no
checksummed copy-alone row; ``copy_threads`` (host_copy's) must be 1. The synthetic KV is
written with host_copy (CPU) or jax_memkind.

``backend="jax_memkind"`` (``--backend jax_memkind``, dram tier only) parks and restores
through :class:`~agentpark.dma.jax_memkind.JaxMemkindTransfer` (device -> pinned_host ->
tier rows, and back), and its reference is not np.copyto but :class:`PinnedPut`: one plain
``jax.device_put`` of one array of the same bytes from the device's memory to ``pinned_host``
just before each pause, and back just before each restore, blocked until ready. That is the
DMA the backend cannot beat, so the target is MEMKIND_TARGET_RATIO of it. Checksum off only
(the checksum is host-side xxh3, the same as host_copy's; the GPU check is about the copy);
``copy_threads`` must be 1. On JAX's CPU platform both memory kinds are host memory: the bench
runs, and says that its figures say nothing about a GPU. A JAX without ``pinned_host``
memory is refused with exit 2 before anything is built.

The shm and disk tier files live in a temporary directory (under /dev/shm, and under the
current directory or ``directory``) that is removed at the end, also on error.
"""

# The package, one job a module, arrows down: run (the bench) -> measure (one size),
# tables, notes, verdicts -> daemon_parts (the hand-wired daemon), references (np.copyto,
# the plain file, the pinned put), arguments -> results, geometry.
from agentpark.bench.common import first_mismatch
from agentpark.bench.transfer.arguments import BACKENDS, SHM_ROOT, TIERS
from agentpark.bench.transfer.references import PinnedPut, PlainFile
from agentpark.bench.transfer.results import SizeResult
from agentpark.bench.transfer.run import run_transfer_bench

__all__ = [
    "BACKENDS",
    "SHM_ROOT",
    "TIERS",
    "PinnedPut",
    "PlainFile",
    "SizeResult",
    "first_mismatch",
    "run_transfer_bench",
]
