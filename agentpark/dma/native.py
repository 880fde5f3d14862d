"""The native copy kernel: rows copied and xxh3-hashed in one pass (``_copyhash.c``).

Why: numpy copies and xxhash hashes, each in its own pass over the bytes, so a checksummed
copy with them costs 20-30% more than a memcpy, and numpy's copies of pieces small enough
to hash from cache go through the cache with read-for-ownership traffic (README,
Benchmarks). The kernel loads each 64-byte stripe once, stores it (non-temporal stores on
request) and folds it into the piece's xxh3-64 while it is in registers. The digest is
exactly ``xxhash.xxh3_64`` of the piece's bytes, so checksums do not depend on which path
computed them (agentpark.integrity).

The kernel is built with the package (setuptools, an optional extension: a machine
without a C compiler installs without it); :func:`available` says whether it loaded, and
host_copy falls back to numpy and xxhash when it did not or when :func:`usable` refuses
the arrays. Loaded with ctypes, which lets go of the GIL during each call, so
``dma.copy_threads`` threads copy in parallel. Every row index is checked here before the
call: the kernel writes where it is told.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import sys
from functools import cache

import numpy as np

__all__ = ["MIN_ROW_BYTES", "available", "copy_rows", "usable"]

log = logging.getLogger(__name__)

MIN_ROW_BYTES = 256
"""Rows (KV blocks) under this use numpy: xxh3 hashes inputs of 240 bytes or less another
way, and the kernel takes only pieces over that (whole 64-byte stripes)."""

_FLAG_STREAM = 1
_FLAG_PORTABLE = 2
_P = ctypes.c_void_p
_SIZE = ctypes.c_size_t


@cache
def _library() -> ctypes.CDLL | None:
    """The built kernel, or None (not built here, or not loadable)."""
    if sys.byteorder != "little":  # the kernel reads words little-endian, as xxh3 does
        return None
    spec = importlib.util.find_spec("agentpark.dma._copyhash")
    if spec is None or spec.origin is None:
        log.info("agentpark.dma: the native copy kernel is not built; copying with numpy")
        return None
    try:
        lib = ctypes.CDLL(spec.origin)
    except OSError as exc:
        log.warning("agentpark.dma: the native copy kernel does not load (%s)", exc)
        return None
    lib.agentpark_copy_rows.restype = ctypes.c_int
    lib.agentpark_copy_rows.argtypes = [
        _P,
        _P,
        _P,
        _P,
        _SIZE,
        _SIZE,
        _SIZE,
        _P,
        _SIZE,
        ctypes.c_int,
    ]
    lib.agentpark_copyhash_path.restype = ctypes.c_int
    lib.agentpark_copyhash_path.argtypes = []
    return lib


def available() -> str | None:
    """The kernel's path on this CPU (``"avx2"``, ``"portable"``), or None if not built."""
    lib = _library()
    if lib is None:
        return None
    return "avx2" if lib.agentpark_copyhash_path() == 2 else "portable"


def usable(dst: np.ndarray, src: np.ndarray) -> bool:
    """Whether the kernel can copy rows of ``src`` into ``dst``: built, both C-contiguous
    with the same row size, a multiple of 64 bytes and at least :data:`MIN_ROW_BYTES`."""
    if _library() is None or dst.ndim < 1 or src.ndim < 1:
        return False
    row = _row_bytes(src)
    return (
        row >= MIN_ROW_BYTES
        and row % 64 == 0
        and _row_bytes(dst) == row
        and dst.flags.c_contiguous
        and src.flags.c_contiguous
    )


def copy_rows(
    dst: np.ndarray,
    dst_rows: np.ndarray,
    src: np.ndarray,
    src_rows: np.ndarray,
    *,
    piece_rows: int = 0,
    digests: np.ndarray | None = None,
    stream: bool = False,
    portable: bool = False,
) -> None:
    """``dst[dst_rows[i]] = src[src_rows[i]]`` for every i, in one pass with the hash.

    With ``digests`` (uint64, one per piece, may be a strided column), the rows go in
    pieces of ``piece_rows`` (the last may be shorter) and each piece's xxh3-64 (its rows'
    bytes in order, as read from ``src``) lands in ``digests``. ``stream``: non-temporal
    stores (a destination not read again soon). ``portable``: the portable C path even
    where AVX2 runs (tests). Raises ValueError for arguments it does not take, before
    anything is copied.
    """
    lib = _library()
    if lib is None:
        raise ValueError("the native copy kernel is not built")
    if not usable(dst, src):
        raise ValueError("the native copy kernel does not take these arrays (see usable)")
    if not dst.flags.writeable:
        raise ValueError("the destination is read-only")
    d_rows = _rows(dst_rows, dst.shape[0], "dst_rows")
    s_rows = _rows(src_rows, src.shape[0], "src_rows")
    n = len(d_rows)
    if len(s_rows) != n:
        raise ValueError(f"{n} destination rows for {len(s_rows)} source rows")
    out_ptr, stride = None, 0
    if digests is not None:
        if piece_rows < 1:
            raise ValueError("piece_rows must be at least 1 with digests")
        pieces = -(-n // piece_rows)
        if digests.dtype != np.uint64 or digests.ndim != 1 or len(digests) != pieces:
            raise ValueError(f"digests must be {pieces} uint64 values")
        if not digests.flags.writeable or digests.strides[0] % 8:
            raise ValueError("digests must be writable, strided in whole uint64s")
        out_ptr, stride = digests.ctypes.data, digests.strides[0] // 8
    flags = (_FLAG_STREAM if stream else 0) | (_FLAG_PORTABLE if portable else 0)
    rc = lib.agentpark_copy_rows(
        dst.ctypes.data,
        d_rows.ctypes.data,
        src.ctypes.data,
        s_rows.ctypes.data,
        n,
        _row_bytes(src),
        piece_rows,
        out_ptr,
        stride,
        flags,
    )
    if rc != 0:
        raise ValueError("the native copy kernel refused: a piece of 240 bytes or less")


def _row_bytes(a: np.ndarray) -> int:
    return int(a.itemsize * np.prod(a.shape[1:], dtype=np.int64)) if a.ndim else 0


def _rows(rows: np.ndarray, limit: int, name: str) -> np.ndarray:
    """``rows`` as contiguous int64, every one in ``[0, limit)``."""
    out = np.ascontiguousarray(rows, dtype=np.int64)
    if out.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional")
    if len(out) and (int(out.min()) < 0 or int(out.max()) >= limit):
        raise ValueError(f"{name} out of range [0, {limit})")
    return out
