"""The notes under ``agentpark bench transfer``'s tables: what was measured against what, on
which pool, tier, backend and copy path, so a printed run describes itself."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from agentpark.bench.common import filesystem_of, human
from agentpark.bench.transfer.daemon_parts import Stack
from agentpark.bench.transfer.references import pool_device
from agentpark.bench.transfer.tables import DMA_CLASS
from agentpark.dma import native
from agentpark.dma.host_copy import HostCopyTransfer
from agentpark.dma.tpu_sync_shm import tpu_sync_version

__all__ = ["notes"]


def notes(stack: Stack, tier: str, tier_dir: Path | None, repeats: int) -> list[str]:
    geometry = stack.engine.geometry
    tier_bytes = stack.tier.capacity_blocks * geometry.block_nbytes
    threads = stack.copy_threads
    threads_note = f"dma.copy_threads = {threads}" + (
        f"; /x{threads} columns divide by an np.copyto split over {threads} threads."
        if threads > 1
        else "."
    )
    if stack.checksummed:
        tables = (
            "with checksums off in the first table and on in the second; the third times "
            f"HostCopyTransfer.d2h/h2d alone. {threads_note}"
        )
    else:
        dma = DMA_CLASS[stack.backend]
        tables = f"with checksums off; the second table times {dma}.d2h/h2d alone."
    reference = (
        "a plain jax.device_put of one array of the same bytes, from the device's memory to "
        "pinned_host before a pause (put d2h) and back before a restore (put h2d), blocked "
        "until ready"
        if stack.backend == "jax_memkind"
        else "same size, preallocated, pre-faulted buffers"
    )
    notes = [
        f"GB = 1e9 bytes; median (min-max) of {repeats} repeats; a ratio is, per repeat, the "
        f"operation's GB/s over the reference run just before it ({reference}); pause and "
        "restore are timed around SessionCore.pause/resume "
        f"(SQLite writes included), {tables}",
        f"pool {geometry.num_blocks} blocks x {human(geometry.block_nbytes)} "
        f"({geometry.block_size} tokens), {tier} tier {human(tier_bytes)}, "
        f"dma {stack.transfer.name}, jax {jax.__version__} ({jax.default_backend()}), "
        f"numpy {np.__version__}.",
    ]
    if stack.backend == "jax_memkind":
        notes.append(_memkind_note(stack))
    elif stack.checksummed:
        kernel = native.available()
        if stack.hash_thread:
            path = (
                "numpy copies, hashed on a second thread, 4 MiB spans behind the pause's copy "
                "and beside the restore's write (the copier hashes a span itself when that "
                "thread is two spans behind)"
            )
        elif stack.native_copy:
            path = (
                f"the native kernel ({kernel} path) copies and hashes in one pass, each "
                "64-byte stripe loaded once, stored with non-temporal stores and folded into "
                "the piece's xxh3 (pause: from the pool; restore: from the tier)"
            )
        else:
            path = (
                "numpy copies; hashed by the copying thread just before it copies the piece, "
                "which then reads it from cache (pause: from the pool; restore: from the tier)"
            )
        path = (
            f"dma.hash_thread = {str(stack.hash_thread).lower()}, dma.native_copy = "
            f"{str(stack.native_copy).lower()}: {path}"
        )
        if kernel is None:
            path += "; the native kernel is not built here"
        else:
            path += (
                ". The kernel-vs-numpy table times both copy loops of the copy alone in the "
                "same repeats"
            )
        notes.append(
            f"checksum: xxh3-64 per 1 MiB piece; {path}; '+ on pause/restore' is the "
            "checksum-on time over the checksum-off one. 'xxh3 alone' is integrity.checksum "
            "over the parked copy (one core). The fused-vs-hash-thread table times both paths "
            "of the copy alone in the same repeats."
        )
        copier = stack.transfer
        if isinstance(copier, HostCopyTransfer):
            went = " and ".join(sorted(stack.restore_paths)) or "-"
            notes.append(
                "restore: in place (numpy writes into the pool arrays' own memory, "
                "dma.host_copy.in_place) where the pool allows it, else XLA's donated writes; "
                f"the session core's restores here went {went}. The "
                "in-place-vs-XLA table times both for the copy alone in the same repeats."
            )
    else:
        notes.append(
            f"tpu_sync: TPU Sync's real KVCacheManager (tpu-sync-jax {tpu_sync_version()}) "
            f"on JAX's {jax.default_backend()!r} platform"
            + (
                " (allowed for the bench as dma.tpu_sync_on_cpu): it copies between host "
                "buffers here, so these figures say nothing about a TPU's DMA engine; no "
                "checksum row, agentpark cannot read TPU Sync's host blocks."
                if jax.default_backend() == "cpu"
                else "; no checksum row, agentpark cannot read TPU Sync's host blocks."
            )
        )
    if tier_dir is not None:
        mount = filesystem_of(tier_dir)
        where = f"{mount[1]} on {mount[0]}" if mount else "unknown filesystem"
        notes.append(f"{tier} tier file in {tier_dir} ({where}); removed at the end.")
    if tier == "disk":
        notes.append(
            "disk: the reference is a plain preallocated file of the same size, written with "
            "os.pwrite + os.fsync and read with os.preadv into a pre-faulted buffer. Pause is "
            "a copy into the tier's MAP_SHARED mapping, then msync + fsync. Reads are served "
            "by the page cache, not the device: both the plain read and the restore (which "
            "reads the tier through its mmap) find the bytes just written still cached, so "
            "they measure memory, and only the write side (fsync) touches the disk."
        )
    return notes


def _memkind_note(stack: Stack) -> str:
    """Where jax_memkind ran: the platform and device, so a GPU run's output says so."""
    device = pool_device(stack.engine)
    platform = jax.default_backend()
    note = (
        f"jax_memkind ran on JAX platform {platform!r}, device {device.device_kind!r} "
        f"({device}); the pool is in the 'device' memory kind, parked rows go through "
        "'pinned_host'; checksum off only (host_copy's bench measures the xxh3 cost)."
    )
    if platform == "cpu":
        note += (
            " On the CPU platform 'device' and 'pinned_host' are both host memory, so these "
            "figures say nothing about a GPU (or TPU) DMA: run deploy/gpu-check.sh on a GPU host."
        )
    return note
