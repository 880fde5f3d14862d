"""in_place: host_copy's restore writes tier rows straight into a CPU pool's own memory.

On JAX's CPU platform a pool array's buffer is ordinary host memory, so the restore can be
the mirror of the pause: numpy copies from the tier into writable views over the pool
arrays' buffers (built from ``unsafe_buffer_pointer()`` and ``nbytes``), each 1 MiB piece
hashed then copied, split over ``dma.copy_threads`` threads in whole pieces. XLA's donated
writes (the other restore path, agentpark.dma.host_copy.xla) are one copy on one thread.

Why writing behind XLA's back is safe here. Everything below happens under ``engine.lock``,
which every reader and writer of the pool holds (EngineAdapter), from :func:`hold` until
the views are dropped:

* Only eligible arrays (:func:`problem`): a ``jax.Array`` on one CPU device, the default
  memory kind, the default row-major untiled layout (C-contiguous, no padding), the
  geometry's shape and dtype, no array twice.
* Exclusive ownership, proved by XLA itself: the arrays are donated to a jitted no-op
  (``optimization_barrier``). XLA runs it after every computation already enqueued on
  those buffers (reads too), and gives its output the input's buffer only when nothing
  else holds that buffer: no live ``np.asarray`` view, no dlpack export, not host memory
  the array was made over (``device_put`` of an aligned numpy array, ``from_dlpack``).
  Otherwise it copies into a fresh buffer that only the output holds (a one-off cost, the
  same XLA's own donated write pays; host_copy logs it once). Either way the output is
  installed with ``set_kv_pool`` and nothing else can see its buffer: a donated input is
  deleted, and whatever held a shared buffer keeps the old bytes, as with XLA's donated
  writes (tests/dma/test_in_place.py checks a live view, a dlpack alias and foreign
  memory on jax 0.10.2). A JAX that forwarded the input instead of running the no-op
  would prove nothing: that restore goes through XLA.
* ``block_until_ready`` on the outputs: no XLA work on the buffers is pending while numpy
  writes, and the next computation that reads them is dispatched under the lock after
  the write.
* The views hold no reference XLA knows about: they exist only while :class:`HeldPool`
  holds the arrays (so the buffers cannot be freed), and :meth:`HeldPool.release` drops
  them before the lock is let go. After the copy the engine's pool must still be those
  arrays, undeleted, at the same addresses (:meth:`HeldPool.check`, as tpu_sync checks its
  device addresses), else TransferError.

When it is not used (the restore goes through XLA): ``in_place=False``, another platform
(GPU or TPU memory is not host memory), any array :func:`problem` rejects, target ids
repeated within a copy chunk (threads would race on one block), or the no-op forwarded.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from functools import partial

import jax
import numpy as np

from agentpark.blocks import PoolGeometry
from agentpark.engine.base import EngineAdapter
from agentpark.errors import TransferError

__all__ = ["HeldPool", "hold", "problem"]


@partial(jax.jit, donate_argnums=0)
def _own(arrays: list[jax.Array]) -> list[jax.Array]:
    """A no-op XLA runs, its outputs aliased to the donated inputs where it may."""
    return jax.lax.optimization_barrier(arrays)  # type: ignore[no-untyped-call,no-any-return]


def problem(arrays: list[jax.Array], geometry: PoolGeometry) -> str | None:
    """Why these pool arrays cannot be written in place with numpy; None when they can."""
    if len(arrays) != len(geometry.arrays):
        return f"{len(arrays)} pool arrays for {len(geometry.arrays)} in the geometry"
    if len({id(a) for a in arrays}) != len(arrays):
        return "the pool lists one array twice"
    for i, (arr, spec) in enumerate(zip(arrays, geometry.arrays, strict=True)):
        why = _array_problem(arr, (geometry.num_blocks, *spec.block_shape), np.dtype(spec.dtype))
        if why is not None:
            return f"pool array {i}: {why}"
    return None


def _array_problem(arr: object, shape: tuple[int, ...], dtype: np.dtype) -> str | None:
    if not isinstance(arr, jax.Array):
        return f"a {type(arr).__name__}, not a jax.Array"
    if arr.is_deleted():
        return "deleted"
    devices = arr.devices()
    if len(devices) != 1:
        return f"on {len(devices)} devices"
    (device,) = devices
    if device.platform != "cpu":
        return f"on {device.platform}, not host memory"
    if arr.sharding.memory_kind not in (None, "device"):
        return f"memory kind {arr.sharding.memory_kind}"
    if tuple(arr.shape) != shape or arr.dtype != dtype:
        return f"{arr.dtype}{list(arr.shape)}, expected {dtype}{list(shape)}"
    # ArrayImpl.format (the type stubs of jax.Array lack it); None when XLA has none.
    layout = getattr(getattr(arr, "format", None), "layout", None)
    if layout is None:
        return "no layout known"
    if (
        tuple(layout.major_to_minor) != tuple(range(arr.ndim))
        or layout.tiling
        or layout.sub_byte_element_size_in_bits
    ):
        return f"layout {layout}, not row-major"
    if arr.on_device_size_in_bytes() != arr.nbytes:
        return f"{arr.on_device_size_in_bytes()} bytes on the device for {arr.nbytes}"
    return None


@dataclass
class HeldPool:
    """The engine's pool arrays, owned and ready, with writable numpy views over them."""

    arrays: list[jax.Array]
    pointers: tuple[int, ...]
    copied: bool = False
    """Some buffer was shared (a live view, an alias, foreign memory): XLA copied it first."""
    views: list[np.ndarray] = field(default_factory=list)

    def release(self) -> None:
        """Drop the views (before the engine lock is let go; always)."""
        self.views.clear()

    def check(self, engine: EngineAdapter) -> None:
        """TransferError unless the engine's pool is still these arrays, where they were."""
        now = list(engine.kv_pool())
        same = len(now) == len(self.arrays) and all(
            a is b and not a.is_deleted() for a, b in zip(now, self.arrays, strict=True)
        )
        if not same or tuple(a.unsafe_buffer_pointer() for a in now) != self.pointers:
            raise TransferError(
                "the engine's pool arrays were replaced while the restore wrote into them "
                "(the engine must hold its lock around every use of the pool)"
            )


def hold(engine: EngineAdapter) -> HeldPool | str:
    """The engine's pool, made exclusively XLA's and ready, with writable views; or why
    not (then nothing was changed but the arrays' identity). Hold ``engine.lock``."""
    arrays = list(engine.kv_pool())
    why = problem(arrays, engine.geometry)
    if why is not None:
        return why
    before = tuple(a.unsafe_buffer_pointer() for a in arrays)
    try:
        owned: list[jax.Array] = _own(arrays)
    except Exception as exc:
        raise TransferError(f"cannot take the pool for an in-place restore: {exc}") from exc
    # The inputs are deleted once donated: the engine must hold the outputs from now on.
    engine.set_kv_pool(owned)
    if any(a is b for a, b in zip(owned, arrays, strict=True)):
        return "JAX forwarded the no-op's input: no proof the buffer is not shared"
    jax.block_until_ready(owned)  # type: ignore[no-untyped-call]
    pointers = tuple(a.unsafe_buffer_pointer() for a in owned)
    held = HeldPool(owned, pointers, copied=pointers != before)
    for arr, ptr in zip(owned, pointers, strict=True):
        raw = (ctypes.c_char * arr.nbytes).from_address(ptr)
        held.views.append(np.frombuffer(memoryview(raw), dtype=arr.dtype).reshape(arr.shape))
    return held
