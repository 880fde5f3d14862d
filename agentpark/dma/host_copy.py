"""host_copy: the CPU backend, where the pool already lives in host memory.

Copy loops: the native kernel (agentpark.dma.native, ``dma.native_copy``, the default where
it is built and every pool array's block is whole 64-byte stripes) copies a chunk's blocks
in one call per pool array, hashing them in the same pass; numpy otherwise, as below. Both
give the same bytes and the same checksum.

Pause: ``np.asarray(pool)`` is a zero-copy view on JAX's CPU backend, so parking is a
gather-copy straight into the preallocated tier buffer: the kernel's (non-temporal stores:
the parked copy is not read again soon), or one ``np.take`` per run of tier slots
(``mode="clip"``: the default ``"raise"`` stages ``out`` through a temporary and runs at a
quarter of memcpy speed; ids are bounds-checked once instead).

Restore, in place (the default on JAX's CPU platform, agentpark.dma.in_place): the
mirror of the pause. The pool arrays are made exclusively XLA's and ready (a donated
no-op, under the engine lock), and numpy copies the tier rows straight into writable views
over their own memory: one ``np.copyto`` per run consecutive on both sides, a row scatter
(``view[ids] = rows``) for a run of tier slots whose pool ids do not run on. The pieces of
a chunk are split over ``copy_threads`` threads, so a second thread shares the write.
in_place's docstring says why this is safe and when it is not used.

Restore through XLA (``in_place=False``, any pool in_place refuses: not a plain
single-device CPU array, target ids repeated in a chunk): jitted writes with the pool
donated (in place), whose input is a view of the tier buffer itself (zero-copy: JAX
aliases 64-byte-aligned host memory, and every tier's buffers are page aligned). Runs
consecutive in the pool too are written with ``dynamic_update_slice`` in power-of-two
pieces (a memcpy); scattered blocks go through a scatter whose update is a power-of-two
window of the tier buffer, rows not being restored getting an out-of-range id and dropped.
Few shapes are ever compiled (:meth:`HostCopyTransfer.warmup`). Gathering inside the jit
instead runs at a tenth of memcpy speed on XLA:CPU. It is one XLA copy on one thread: more
``copy_threads`` can only hash beside it.

Copies go in chunks of at most ``chunk_bytes``, each under the engine lock and the lock
let go between chunks, so other sessions keep decoding while a large session moves: the
bytes in flight at any moment are bounded by one chunk.

Checksum (``digest=True``, see agentpark.integrity): the kernel folds each stripe into its
piece's xxh3 as it copies it (from the pool on a pause, from the tier on a restore). The
numpy loop hashes a 1 MiB piece just before copying it, so the copy reads it from L2. The
XLA restore hashes an 8 MiB span of the tier, then writes it into the pool (from L3), or,
with ``copy_threads`` > 1, hashes it on the workers while this thread writes it. Without
the kernel one thread cannot hide the hash: it costs its compute time from cache (xxh3 ~4x
memcpy speed there); see the README's Benchmarks for what each path measures.

``copy_threads`` > 1: a pause's or in-place restore's chunk is split over that many threads
(this one and a small pool), in whole pieces when hashing; numpy's copies and xxhash
release the GIL.

``hash_thread`` (``dma.hash_thread``): numpy copies, and a copy of more than one 4 MiB span
hashes on one more thread instead (agentpark.dma.hash_thread): the pause posts each span it
has copied, the restore each span it is about to write, and the copier hashes a span itself
whenever that thread is two spans behind. Same checksum; it pays only where a core is idle (README).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from typing import TypeVar

import jax
import numpy as np

from agentpark.blocks import PoolGeometry, check_copy, contiguous_runs, paired_runs
from agentpark.dma import native
from agentpark.dma.hash_thread import HashJob, PieceHasher
from agentpark.dma.in_place import HeldPool, hold
from agentpark.engine.base import EngineAdapter
from agentpark.errors import TransferError
from agentpark.integrity import combine, piece_blocks, piece_digest
from agentpark.tiers.base import HostTier

__all__ = ["DEFAULT_CHUNK_BYTES", "MAX_COPY_THREADS", "HostCopyTransfer"]

log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 64 * 2**20
MAX_COPY_THREADS = 64
# A restore with its checksum hashes this much of the tier, then writes it into the pool
# while it is still in the (32 MiB) L3; a piece at a time would pay a jit dispatch per MiB.
_FUSED_SPAN_BYTES = 8 * 2**20
# dma.hash_thread: the copier posts spans of this much to the hash thread, which may be at
# most _HASH_DEPTH spans behind (what it hashes is then still in the L3).
HASH_SPAN_BYTES = 4 * 2**20
_HASH_DEPTH = 2

_T = TypeVar("_T")


@partial(jax.jit, donate_argnums=0)
def _scatter_rows(pool: jax.Array, window: jax.Array, targets: jax.Array) -> jax.Array:
    return pool.at[targets].set(window, mode="drop")


@partial(jax.jit, donate_argnums=0)
def _write_rows(pool: jax.Array, rows: jax.Array, first: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_slice_in_dim(pool, rows, first, axis=0)


# A run at least this long that is consecutive in the pool too is written with a
# dynamic_update_slice (a plain memcpy in XLA, ~0.95x memcpy) instead of the scatter
# (~0.85x); shorter, scattered runs keep the scatter, which takes any block order.
_SLICE_MIN_BLOCKS = 8


def _bucket(n: int, cap: int) -> int:
    return min(1 << (n - 1).bit_length(), cap)


class HostCopyTransfer:
    """Moves blocks with memcpy-class host copies; the default on the CPU platform."""

    name = "host_copy"

    def __init__(
        self,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        copy_threads: int = 1,
        hash_thread: bool = False,
        in_place: bool = True,
        native_copy: bool = True,
    ) -> None:
        if not 1 <= copy_threads <= MAX_COPY_THREADS:
            raise ValueError(f"copy_threads must be 1..{MAX_COPY_THREADS}, got {copy_threads}")
        self.chunk_bytes = chunk_bytes
        self.copy_threads = copy_threads
        # dma.hash_thread: with a checksum, one more thread hashes while the copy runs
        # (agentpark.dma.hash_thread); copies of one span or less stay fused.
        self.hash_thread = hash_thread
        self.hash_span_bytes = HASH_SPAN_BYTES
        self.hasher = PieceHasher(_HASH_DEPTH)
        # dma.native_copy: pauses and in-place restores through the native kernel
        # (agentpark.dma.native: copy and hash in one pass) where it is built and takes the
        # arrays; numpy and xxhash otherwise, and always with the hash thread.
        self.native_copy = native_copy and native.available() is not None
        # Called between chunks, outside the engine lock: progress bars, and tests that
        # need a copy held open while they check that others are not blocked.
        self.chunk_hook: Callable[[int], None] | None = None
        # Restores write the pool's own memory with numpy where it allows (in_place);
        # which path the last restored chunk took: "in place", "xla" (None before any).
        self.in_place = in_place
        self.last_restore_path: str | None = None
        self._fallback_logged: str | None = None
        self._warned_unaligned = False
        self._warned_copied = False
        self._workers: ThreadPoolExecutor | None = None
        self._workers_lock = threading.Lock()

    def _chunk_blocks(self, geometry: PoolGeometry) -> int:
        """Blocks per chunk: about ``chunk_bytes``, in whole hash pieces."""
        k = piece_blocks(geometry)
        return max(k, self.chunk_bytes // geometry.block_nbytes // k * k)

    def _chunks(self, geometry: PoolGeometry, n: int) -> list[tuple[int, int]]:
        """``[lo, hi)`` positions of each chunk of an ``n``-block copy."""
        per = self._chunk_blocks(geometry)
        return [(lo, min(lo + per, n)) for lo in range(0, n, per)]

    def _parts(self, lo: int, hi: int, unit: int, parts: int) -> list[tuple[int, int]]:
        """``[lo, hi)`` cut into at most ``parts`` ranges of whole ``unit``s, in order."""
        units = -(-(hi - lo) // unit)
        parts = max(1, min(parts, units))
        cuts = [lo + min(hi - lo, (units * i // parts) * unit) for i in range(parts + 1)]
        return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]

    def _map(self, fn: Callable[[int, int], _T], ranges: Sequence[tuple[int, int]]) -> list[_T]:
        """``fn`` over ``ranges``: the last on this thread, the others on the workers."""
        if len(ranges) == 1:
            return [fn(*ranges[0])]
        futures = [self._pool().submit(fn, a, b) for a, b in ranges[:-1]]
        try:
            last = fn(*ranges[-1])
        finally:
            # Never return (and let go of the engine lock, or free the slots) while a
            # worker still writes.
            wait(futures)
        return [*(f.result() for f in futures), last]

    def _pool(self) -> ThreadPoolExecutor:
        """The ``copy_threads - 1`` worker threads, started on first use."""
        with self._workers_lock:
            if self._workers is None:
                self._workers = ThreadPoolExecutor(
                    self.copy_threads - 1, thread_name_prefix="agentpark-copy"
                )
            return self._workers

    def close(self) -> None:
        """Stop the worker and hash threads (a later copy starts them again)."""
        with self._workers_lock:
            workers, self._workers = self._workers, None
        if workers is not None:
            workers.shutdown(wait=True)
        self.hasher.close()

    def _span_blocks(self, geometry: PoolGeometry) -> int:
        """Blocks per span posted to the hash thread: whole pieces, at least one."""
        k = piece_blocks(geometry)
        return max(k, self.hash_span_bytes // geometry.block_nbytes // k * k)

    def _hash_job(
        self, geometry: PoolGeometry, buffers: Sequence[np.ndarray], slots: Sequence[int]
    ) -> HashJob | None:
        """The hash thread's job for this copy, or None to hash fused on this thread:
        ``dma.hash_thread`` off, a copy of one span or less, or the thread busy."""
        if not self.hash_thread or len(slots) <= self._span_blocks(geometry):
            return None
        return self.hasher.try_start(buffers, slots, piece_blocks(geometry))

    @property
    def copy_loop(self) -> str:
        """Which copy loop pauses and in-place restores run (for the start-up log)."""
        if self.hash_thread:
            return "numpy + hash thread"
        if self.native_copy:
            return f"native kernel, {native.available()}"
        return "numpy"

    def _native(self, dsts: Sequence[np.ndarray], srcs: Sequence[np.ndarray]) -> bool:
        """Whether this copy goes through the native kernel (``dma.native_copy``)."""
        pairs = zip(dsts, srcs, strict=True)
        return self.native_copy and all(native.usable(d, s) for d, s in pairs)

    def _after_chunk(self, nbytes: int) -> None:
        if self.chunk_hook is not None:
            self.chunk_hook(nbytes)

    def d2h(
        self,
        engine: EngineAdapter,
        block_ids: Sequence[int],
        tier: HostTier,
        slots: Sequence[int],
        digest: bool = False,
    ) -> str | None:
        """Copy pool blocks into tier slots; with ``digest``, hash each piece as it goes.

        Each piece (integrity.piece_blocks) is hashed from the pool just before it is
        copied, so the copy reads it from cache; the pieces of a chunk are split over
        ``copy_threads`` threads in whole pieces, so the checksum is the same for any
        thread count.
        """
        check_copy(block_ids, engine.geometry.num_blocks, slots, tier.capacity_blocks)
        buffers = tier.buffers()
        return self._hashed(
            engine.geometry,
            buffers,
            slots,
            digest,
            partial(self._d2h_chunks, engine, block_ids, buffers, slots, digest),
        )

    def _hashed(
        self,
        geometry: PoolGeometry,
        buffers: list[np.ndarray],
        slots: Sequence[int],
        digest: bool,
        copy: Callable[[HashJob | None], list[bytes]],
    ) -> str | None:
        """Run ``copy`` with the hash thread's job or fused (None); the checksum, if any."""
        job = self._hash_job(geometry, buffers, slots) if digest else None
        if job is None:
            pieces = copy(None)
            return combine(pieces) if digest else None
        try:
            copy(job)
            return combine(job.finish())
        finally:
            job.abandon()  # a no-op after finish; after a failure, waits for the thread

    def _d2h_chunks(
        self,
        engine: EngineAdapter,
        block_ids: Sequence[int],
        buffers: list[np.ndarray],
        slots: Sequence[int],
        digest: bool,
        job: HashJob | None,
    ) -> list[bytes]:
        """The copy, chunk by chunk; the fused piece digests (none with ``job``)."""
        k = piece_blocks(engine.geometry)
        span = self._span_blocks(engine.geometry)
        pieces: list[bytes] = []
        for lo, hi in self._chunks(engine.geometry, len(slots)):
            src_ids = np.asarray(block_ids[lo:hi], dtype=np.intp)
            chunk_slots = slots[lo:hi]
            unit = span if job is not None else k if digest else 1
            ranges = self._parts(0, hi - lo, unit, self.copy_threads)
            with engine.lock:
                views = [np.asarray(arr) for arr in engine.kv_pool()]  # zero-copy on CPU
                try:
                    gather: Callable[[int, int], list[bytes]]
                    if job is not None:
                        gather = partial(
                            _gather_spans, views, buffers, src_ids, chunk_slots, span, job, lo
                        )
                    elif self._native(buffers, views):
                        gather = partial(
                            _copy_native,
                            buffers,
                            _int64(chunk_slots),
                            views,
                            src_ids,
                            k if digest else 0,
                            True,
                        )
                    else:
                        gather = partial(
                            _gather, views, buffers, src_ids, chunk_slots, k if digest else 0
                        )
                    for part in self._map(gather, ranges):
                        pieces.extend(part)
                finally:
                    # A live view would make the next donating step copy the whole pool.
                    views.clear()
            self._after_chunk((hi - lo) * engine.geometry.block_nbytes)
        return pieces

    def h2d(
        self,
        tier: HostTier,
        slots: Sequence[int],
        engine: EngineAdapter,
        block_ids: Sequence[int],
        digest: bool = False,
    ) -> str | None:
        """Copy tier slots into pool blocks; with ``digest``, hash each piece as it goes.

        In place (agentpark.dma.in_place): each piece of the tier is hashed, then copied
        into the pool's own memory while it is still in cache, the pieces of a chunk split
        over ``copy_threads`` threads; through XLA otherwise (see :meth:`_h2d_xla`). The
        caller compares the returned checksum and must not use the blocks when it differs
        (they hold whatever the tier held).
        """
        check_copy(block_ids, engine.geometry.num_blocks, slots, tier.capacity_blocks)
        return self._hashed(
            engine.geometry,
            tier.buffers(),
            slots,
            digest,
            partial(self._h2d_chunks, tier, slots, engine, block_ids, digest),
        )

    def _h2d_chunks(
        self,
        tier: HostTier,
        slots: Sequence[int],
        engine: EngineAdapter,
        block_ids: Sequence[int],
        digest: bool,
        job: HashJob | None,
    ) -> list[bytes]:
        """The restore, chunk by chunk; the piece digests hashed here (none with ``job``).

        Each chunk is written in place with numpy when the pool allows it (agentpark.dma.
        in_place), else through XLA; the pool may change between chunks, so each decides.
        """
        pieces: list[bytes] = []
        buffers = tier.buffers()
        for lo, hi in self._chunks(engine.geometry, len(slots)):
            ids, chunk_slots = block_ids[lo:hi], slots[lo:hi]
            with engine.lock:
                held = self._hold(engine, ids)
                if isinstance(held, HeldPool):
                    try:
                        part = self._h2d_in_place(
                            engine.geometry, held, buffers, chunk_slots, ids, digest, job, lo
                        )
                    except Exception as exc:
                        raise TransferError(f"in-place restore failed: {exc}") from exc
                    finally:
                        held.release()
                    held.check(engine)
                else:
                    part = self._h2d_xla(buffers, chunk_slots, ids, engine, digest, job, lo)
                pieces.extend(part)
            self._after_chunk((hi - lo) * engine.geometry.block_nbytes)
        return pieces

    def _hold(self, engine: EngineAdapter, ids: Sequence[int]) -> HeldPool | None:
        """The pool held for an in-place write of ``ids``, or None to write through XLA."""
        why = "host_copy.in_place is off"
        if self.in_place:
            if len(set(ids)) != len(ids):
                why = "a block id repeats within the chunk"
            else:
                held = hold(engine)
                if isinstance(held, HeldPool):
                    self.last_restore_path = "in place"
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
        self.last_restore_path = "xla"
        if self.in_place and why != self._fallback_logged:
            self._fallback_logged = why
            log.info("host_copy: restoring through XLA, not in place: %s", why)
        return None

    def _h2d_in_place(
        self,
        geometry: PoolGeometry,
        held: HeldPool,
        buffers: list[np.ndarray],
        slots: Sequence[int],
        ids: Sequence[int],
        digest: bool,
        job: HashJob | None,
        offset: int,
    ) -> list[bytes]:
        """One chunk with numpy into the held pool: the pause's loop the other way round,
        split over ``copy_threads`` threads (in whole pieces with ``digest``, whole spans
        with ``job``); the fused piece digests, in order."""
        k = piece_blocks(geometry)
        dst_ids = np.asarray(ids, dtype=np.intp)
        steps = np.diff(dst_ids) == 1  # where the pool ids run on
        scatter: Callable[[int, int], list[bytes]]
        if job is not None:
            span = unit = self._span_blocks(geometry)
            scatter = partial(
                _scatter_spans, held.views, buffers, dst_ids, steps, slots, span, job, offset
            )
        elif self._native(held.views, buffers):
            unit = k if digest else 1
            # Hashed from the tier (the source), as _scatter hashes it.
            scatter = partial(
                _copy_native,
                held.views,
                dst_ids,
                buffers,
                _int64(slots),
                k if digest else 0,
                True,
            )
        else:
            unit = k if digest else 1
            scatter = partial(
                _scatter, held.views, buffers, dst_ids, steps, slots, k if digest else 0
            )
        ranges = self._parts(0, len(ids), unit, self.copy_threads)
        return [d for part in self._map(scatter, ranges) for d in part]

    def _h2d_xla(
        self,
        buffers: list[np.ndarray],
        chunk_slots: Sequence[int],
        ids: Sequence[int],
        engine: EngineAdapter,
        digest: bool,
        job: HashJob | None,
        offset: int,
    ) -> list[bytes]:
        """One chunk through XLA's donated writes (hold the lock); the digests hashed here.

        The tier's pieces are hashed a span (``_FUSED_SPAN_BYTES``) at a time: with one
        thread just before the span is written into the pool, so the write reads it from
        cache; with more, on the ``copy_threads - 1`` workers while this thread writes it
        (the write is one XLA copy either way).
        """
        geometry = engine.geometry
        k = piece_blocks(geometry)
        if job is not None:
            span = self._span_blocks(geometry)
        else:
            span = max(k, _FUSED_SPAN_BYTES // geometry.block_nbytes // k * k)
        threads = self.copy_threads
        pieces: list[bytes] = []
        # Slice writes when every run consecutive on both sides is long (a memcpy); else
        # the scatter, which takes any block order.
        slices = all(n >= _SLICE_MIN_BLOCKS for n in paired_runs(chunk_slots, ids)[2])
        n = len(ids)
        spans = [(a, min(a + span, n)) for a in range(0, n, span)] if digest else [(0, n)]
        pool = list(engine.kv_pool())
        try:
            for a, b in spans:
                pending: list[Future[list[bytes]]] = []
                if job is not None:
                    # The hash thread reads the span beside this thread's write.
                    job.post(offset + a, offset + b)
                elif digest and threads > 1:
                    # Overlap: the workers hash the span while this thread writes it.
                    hash_span = partial(_hash, buffers, chunk_slots, k)
                    for x, y in self._parts(a, b, k, threads - 1):
                        pending.append(self._pool().submit(hash_span, x, y))
                elif digest:
                    pieces.extend(_hash(buffers, chunk_slots, k, a, b))
                try:
                    for i, buf in enumerate(buffers):
                        pool[i] = self._write_span(
                            pool[i], buf, chunk_slots[a:b], ids[a:b], slices, engine
                        )
                finally:
                    wait(pending)
                for future in pending:
                    pieces.extend(future.result())
            jax.block_until_ready(pool)  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise TransferError(f"restore scatter failed: {exc}") from exc
        finally:
            engine.set_kv_pool(pool)
        return pieces

    def _write_span(
        self,
        pool: jax.Array,
        buf: np.ndarray,
        slots: Sequence[int],
        ids: Sequence[int],
        slices: bool,
        engine: EngineAdapter,
    ) -> jax.Array:
        """Write tier rows ``slots[i]`` into pool blocks ``ids[i]`` of one pool array."""
        if slices:
            for start, first, n in zip(*paired_runs(slots, ids), strict=True):
                # Power-of-two pieces: a fixed, small set of shapes is ever compiled.
                for offset, size in _power_of_two_pieces(n):
                    rows = buf[start + offset : start + offset + size]
                    self._warn_if_unaligned(rows)
                    pool = _write_rows(pool, rows, np.int32(first + offset))
            return pool
        for pos, slot, n in contiguous_runs(slots):
            pool = self._scatter_run(pool, buf, slot, ids[pos : pos + n], engine)
        return pool

    def _scatter_run(
        self,
        pool: jax.Array,
        buf: np.ndarray,
        slot: int,
        ids: Sequence[int],
        engine: EngineAdapter,
    ) -> jax.Array:
        """Scatter tier rows ``slot..slot+len(ids)`` into pool blocks ``ids``."""
        size = _bucket(len(ids), buf.shape[0])
        start = min(slot, buf.shape[0] - size)
        targets = np.full(size, engine.geometry.num_blocks, dtype=np.int32)
        targets[slot - start : slot - start + len(ids)] = ids
        window = buf[start : start + size]
        self._warn_if_unaligned(window)
        scattered: jax.Array = _scatter_rows(pool, window, targets)
        return scattered

    def warmup(self, engine: EngineAdapter, tier: HostTier) -> None:
        """Compile both XLA restore paths for every shape a restore can use, and the
        in-place path's no-op, writing nothing.

        The scatter gets all targets out of range; the slice write puts the pool's own
        first rows back in place. Without this, the first restore of each new size pays
        its compile (tens of ms) in the resume it delays.
        """
        per = self._chunk_blocks(engine.geometry)
        if tier.capacity_blocks == 0:
            return
        sizes = sorted({_bucket(n, tier.capacity_blocks) for n in _powers_of_two(per)})
        with engine.lock:
            pool = list(engine.kv_pool())
            try:
                for size in sizes:
                    targets = np.full(size, engine.geometry.num_blocks, dtype=np.int32)
                    for i, buf in enumerate(tier.buffers()):
                        pool[i] = _scatter_rows(pool[i], buf[:size], targets)
                        if size <= engine.geometry.num_blocks:
                            same = np.array(np.asarray(pool[i][:size]))  # its own rows
                            pool[i] = _write_rows(pool[i], same, np.int32(0))
                jax.block_until_ready(pool)  # type: ignore[no-untyped-call]
            finally:
                engine.set_kv_pool(pool)
            if self.in_place:  # and the in-place path's donated no-op, for this pool
                held = hold(engine)
                if isinstance(held, HeldPool):
                    held.release()

    def _warn_if_unaligned(self, window: np.ndarray) -> None:
        if window.ctypes.data % 64 and not self._warned_unaligned:
            self._warned_unaligned = True
            log.warning(
                "host_copy: a tier buffer is not 64-byte aligned; every restore copies it "
                "first and runs at a fraction of memcpy speed"
            )


def _gather(
    views: Sequence[np.ndarray],
    buffers: Sequence[np.ndarray],
    src_ids: np.ndarray,
    slots: Sequence[int],
    k: int,
    lo: int,
    hi: int,
) -> list[bytes]:
    """Copy positions ``lo..hi`` of a chunk from the pool views into the tier buffers.

    ``k`` > 0: piece by piece (``lo`` on a piece boundary), each pool array's rows of a
    piece hashed from the pool just before they are copied, so the copy reads them from
    cache; returns the piece digests in order. (Hashing the tier's rows after the copy
    instead measured 0.72-0.76x memcpy against 0.85-0.93x this way: the copy's stores
    evict what the hash would have read.) The digest is the same either way: the same
    bytes in the same order.
    """
    if not k:
        for pos, slot, n in contiguous_runs(slots[lo:hi]):
            ids = src_ids[lo + pos : lo + pos + n]
            for view, buf in zip(views, buffers, strict=True):
                np.take(view, ids, axis=0, out=buf[slot : slot + n], mode="clip")
        return []
    digests: list[bytes] = []
    for p in range(lo, hi, k):
        q = min(p + k, hi)
        runs = contiguous_runs(slots[p:q])
        sources = contiguous_runs(src_ids[p:q].tolist())
        for view, buf in zip(views, buffers, strict=True):
            digests.append(piece_digest(view, sources))
            for pos, slot, n in runs:
                ids = src_ids[p + pos : p + pos + n]
                np.take(view, ids, axis=0, out=buf[slot : slot + n], mode="clip")
    return digests


def _copy_native(
    dsts: Sequence[np.ndarray],
    dst_rows: np.ndarray,
    srcs: Sequence[np.ndarray],
    src_rows: np.ndarray,
    k: int,
    stream: bool,
    lo: int,
    hi: int,
) -> list[bytes]:
    """Positions ``lo..hi`` of a chunk through the native kernel, each array in one call:
    ``dsts[a][dst_rows[i]] = srcs[a][src_rows[i]]``. ``k`` > 0: hashed as it is copied,
    in pieces of ``k`` rows (``lo`` on a piece boundary), from the source; returns the
    piece digests in the order :func:`_gather` and :func:`_scatter` do (piece by piece,
    array by array within a piece), the same bytes as theirs."""
    rows_out, rows_in = dst_rows[lo:hi], src_rows[lo:hi]
    if not k:
        for dst, src in zip(dsts, srcs, strict=True):
            native.copy_rows(dst, rows_out, src, rows_in, stream=stream)
        return []
    out = np.empty((-(-(hi - lo) // k), len(srcs)), dtype=np.uint64)
    for a, (dst, src) in enumerate(zip(dsts, srcs, strict=True)):
        native.copy_rows(
            dst, rows_out, src, rows_in, piece_rows=k, digests=out[:, a], stream=stream
        )
    blob = out.astype(">u8").tobytes()  # xxhash's digest(): the value, big-endian
    return [blob[i : i + 8] for i in range(0, len(blob), 8)]


def _int64(rows: Sequence[int]) -> np.ndarray:
    return np.asarray(rows, dtype=np.int64)


def _gather_spans(
    views: Sequence[np.ndarray],
    buffers: Sequence[np.ndarray],
    src_ids: np.ndarray,
    slots: Sequence[int],
    span: int,
    job: HashJob,
    offset: int,
    lo: int,
    hi: int,
) -> list[bytes]:
    """Copy positions ``lo..hi`` of a chunk a span at a time, posting each copied span
    (positions in the whole copy: ``offset`` is the chunk's) to the hash thread."""
    for a in range(lo, hi, span):
        b = min(a + span, hi)
        _gather(views, buffers, src_ids, slots, 0, a, b)
        job.post(offset + a, offset + b)
    return []


def _scatter(
    views: Sequence[np.ndarray],
    buffers: Sequence[np.ndarray],
    dst_ids: np.ndarray,
    steps: np.ndarray,
    slots: Sequence[int],
    k: int,
    lo: int,
    hi: int,
) -> list[bytes]:
    """Copy positions ``lo..hi`` of a chunk from the tier buffers into the pool views.

    The mirror of :func:`_gather`. ``k`` > 0: piece by piece (``lo`` on a piece boundary),
    each buffer's rows of a piece hashed just before they are copied, so the copy reads
    them from cache; returns the piece digests in order, the same as :func:`_hash`'s.
    ``steps[i]``: ``dst_ids[i + 1] == dst_ids[i] + 1``; a run of tier slots whose pool ids
    run on too is one slice copy, any other a row scatter.
    """
    digests: list[bytes] = []
    for p in range(lo, hi, k or max(1, hi - lo)):
        q = min(p + k, hi) if k else hi
        # One-block pieces (blocks of 1 MiB or more) are the common case: skip the scan.
        runs = [(0, slots[p], 1)] if q - p == 1 else contiguous_runs(slots[p:q])
        for buf, view in zip(buffers, views, strict=True):
            if k:
                digests.append(piece_digest(buf, runs))
            for pos, slot, n in runs:
                at = p + pos
                if n == 1 or steps[at : at + n - 1].all():
                    first = int(dst_ids[at])
                    np.copyto(view[first : first + n], buf[slot : slot + n])
                else:
                    view[dst_ids[at : at + n]] = buf[slot : slot + n]
    return digests


def _scatter_spans(
    views: Sequence[np.ndarray],
    buffers: Sequence[np.ndarray],
    dst_ids: np.ndarray,
    steps: np.ndarray,
    slots: Sequence[int],
    span: int,
    job: HashJob,
    offset: int,
    lo: int,
    hi: int,
) -> list[bytes]:
    """Copy positions ``lo..hi`` of a chunk a span at a time, posting each span to the
    hash thread just before writing it (positions in the whole copy: ``offset`` is the
    chunk's), so the two read it at once."""
    for a in range(lo, hi, span):
        b = min(a + span, hi)
        job.post(offset + a, offset + b)
        _scatter(views, buffers, dst_ids, steps, slots, 0, a, b)
    return []


def _hash(
    buffers: Sequence[np.ndarray], slots: Sequence[int], k: int, lo: int, hi: int
) -> list[bytes]:
    """Piece digests of tier rows ``slots[lo:hi]`` (``lo`` on a piece boundary)."""
    digests: list[bytes] = []
    for p in range(lo, hi, k):
        runs = contiguous_runs(slots[p : min(p + k, hi)])
        digests.extend(piece_digest(buf, runs) for buf in buffers)
    return digests


def _power_of_two_pieces(n: int) -> list[tuple[int, int]]:
    """Split ``n`` rows into (offset, size) pieces whose sizes are powers of two."""
    pieces, offset = [], 0
    for bit in range(n.bit_length() - 1, -1, -1):
        size = 1 << bit
        if n & size:
            pieces.append((offset, size))
            offset += size
    return pieces


def _powers_of_two(limit: int) -> list[int]:
    out, n = [], 1
    while n < limit:
        out.append(n)
        n *= 2
    return [*out, limit]
