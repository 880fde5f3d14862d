"""The references ``agentpark bench transfer`` times beside each operation: a plain file
(disk), a plain pinned ``jax.device_put`` (jax_memkind) and an ``np.copyto`` split over
threads (``--copy-threads``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import numpy as np

from agentpark.dma.jax_memkind import DEVICE, PINNED_HOST
from agentpark.engine.base import EngineAdapter

__all__ = ["PinnedPut", "PlainFile", "pool_device", "threaded_copyto"]


class PlainFile:
    """The disk reference: a preallocated file written with ``os.pwrite`` + ``os.fsync`` and
    read back with ``os.preadv``, from and into pre-faulted buffers."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(self._fd, 0, size)
            os.fsync(self._fd)
        except BaseException:
            self.close()
            raise

    def write(self, buf: np.ndarray) -> None:
        view = buf.reshape(-1).view(np.uint8).data
        done = 0
        while done < self.size:
            done += os.pwrite(self._fd, view[done : self.size], done)
        os.fsync(self._fd)

    def read(self, buf: np.ndarray) -> None:
        view = buf.reshape(-1).view(np.uint8).data
        done = 0
        while done < self.size:
            n = os.preadv(self._fd, [view[done : self.size]], done)
            if n <= 0:
                raise OSError(f"{self.path}: short read at byte {done} of {self.size}")
            done += n

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.path.unlink(missing_ok=True)


class PinnedPut:
    """The jax_memkind reference: one plain ``jax.device_put`` of one array of ``size`` bytes
    between the device's memory and ``pinned_host`` memory on ``device``, blocked until ready.

    :meth:`d2h` is what a pause's DMA is, :meth:`h2d` a restore's, without the gather, the
    scatter, the chunking and the copies into and out of the tier's rows. Each call makes a
    new array and drops it, as the backend does with its chunks.
    """

    def __init__(self, size: int, device: jax.Device) -> None:
        self.size = size
        self.on_device_kind = jax.sharding.SingleDeviceSharding(device, memory_kind=DEVICE)
        self.on_host_kind = jax.sharding.SingleDeviceSharding(device, memory_kind=PINNED_HOST)
        ones = np.ones(size, dtype=np.uint8)
        self.on_device: jax.Array | None = jax.device_put(ones, self.on_device_kind)
        self.on_host: jax.Array | None = jax.device_put(self.on_device, self.on_host_kind)
        self.on_host.block_until_ready()

    def d2h(self) -> None:
        moved = jax.device_put(self.on_device, self.on_host_kind)
        moved.block_until_ready()
        moved.delete()

    def h2d(self) -> None:
        moved = jax.device_put(self.on_host, self.on_device_kind)
        moved.block_until_ready()
        moved.delete()

    def close(self) -> None:
        for array in (self.on_device, self.on_host):
            if array is not None:
                array.delete()
        self.on_device = self.on_host = None


def threaded_copyto(
    threads: int, cleanup: contextlib.ExitStack
) -> Callable[[np.ndarray, np.ndarray], None] | None:
    """``np.copyto`` split into ``threads`` page-aligned parts, one per thread; None for 1."""
    if threads == 1:
        return None
    workers = ThreadPoolExecutor(threads - 1, thread_name_prefix="bench-copyto")
    cleanup.callback(workers.shutdown)

    def copy(dst: np.ndarray, src: np.ndarray) -> None:
        step = -(-src.size // threads // 4096) * 4096
        futures = [
            workers.submit(np.copyto, dst[i : i + step], src[i : i + step])
            for i in range(step, src.size, step)
        ]
        np.copyto(dst[:step], src[:step])
        for future in futures:
            future.result()

    return copy


def pool_device(engine: EngineAdapter) -> jax.Device:
    """The device the pool lives on (the bench's engine is on one device)."""
    with engine.lock:
        pool = engine.kv_pool()[0]
        return next(iter(pool.sharding.device_set))
