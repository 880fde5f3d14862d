"""The native copy kernel: exact copies, and digests equal to the xxhash package's xxh3-64."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import xxhash

from agentpark.dma import native

# Both C paths on this CPU: the AVX2 one (where it runs) and the portable one.
PATHS = [False, True]


def test_the_kernel_is_built_where_a_c_compiler_is() -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: the package installs without the kernel")
    assert native.available() in {"avx2", "portable"}


def _rows(rng: np.random.Generator, n: int, row_bytes: int) -> np.ndarray:
    return rng.integers(0, 256, (n, row_bytes), dtype=np.uint8)


def _expected(src: np.ndarray, rows: np.ndarray, k: int) -> list[int]:
    return [
        xxhash.xxh3_64_intdigest(b"".join(src[r].tobytes() for r in rows[i : i + k]))
        for i in range(0, len(rows), k)
    ]


@pytest.mark.parametrize("portable", PATHS)
@pytest.mark.parametrize("stream", [False, True])
def test_scattered_rows_copy_exactly_with_xxh3_digests_per_piece(
    portable: bool, stream: bool
) -> None:
    rng = np.random.default_rng(11)
    # Row sizes around xxh3's 1 KiB block (16 stripes), pieces that end mid-block, on a
    # block boundary, and with the last piece short.
    for row_bytes in (256, 320, 1024, 1088, 4096):
        for n, k in ((1, 1), (7, 3), (16, 4), (9, 9), (20, 6)):
            src = _rows(rng, 32, row_bytes)
            dst = np.zeros((40, row_bytes), np.uint8)
            src_rows = rng.choice(32, n, replace=False)
            dst_rows = rng.choice(40, n, replace=False)
            digests = np.zeros(-(-n // k), np.uint64)
            native.copy_rows(
                dst,
                dst_rows,
                src,
                src_rows,
                piece_rows=k,
                digests=digests,
                stream=stream,
                portable=portable,
            )
            np.testing.assert_array_equal(dst[dst_rows], src[src_rows])
            untouched = np.setdiff1d(np.arange(40), dst_rows)
            assert not dst[untouched].any()
            assert digests.tolist() == _expected(src, src_rows, k), (row_bytes, n, k)


@pytest.mark.parametrize("portable", PATHS)
def test_a_whole_mebibyte_piece_matches_xxhash(portable: bool) -> None:
    """The size of integrity.PIECE_BYTES: 1024 xxh3 blocks, the last one's stripes."""
    rng = np.random.default_rng(5)
    src = _rows(rng, 16, 2**16)
    dst = np.empty_like(src)
    digests = np.zeros(1, np.uint64)
    rows = np.arange(16)
    native.copy_rows(dst, rows, src, rows, piece_rows=16, digests=digests, portable=portable)
    assert int(digests[0]) == xxhash.xxh3_64_intdigest(src.tobytes())
    np.testing.assert_array_equal(dst, src)


def test_digests_land_in_a_strided_column_and_multidimensional_rows_count_whole() -> None:
    rng = np.random.default_rng(2)
    src = rng.integers(0, 2**16, (10, 4, 8, 4), dtype=np.uint16)  # 256-byte rows
    dst = np.zeros_like(src)
    out = np.zeros((4, 3), np.uint64)
    rows = np.arange(10)[::-1].copy()
    native.copy_rows(dst, rows, src, rows, piece_rows=3, digests=out[:, 1])
    np.testing.assert_array_equal(dst, src)
    flat = src.reshape(10, -1).view(np.uint8)
    assert out[:, 1].tolist() == _expected(flat, rows, 3)
    assert not out[:, [0, 2]].any()


def test_an_unaligned_destination_is_copied_exactly_when_streaming() -> None:
    """Non-temporal stores need 32-byte alignment: elsewhere the kernel stores plainly."""
    rng = np.random.default_rng(3)
    src = _rows(rng, 4, 256)
    raw = np.zeros(4 * 256 + 32, np.uint8)
    at = (16 - raw.ctypes.data) % 32  # 16 bytes past a 32-byte boundary
    dst = raw[at : at + 4 * 256].reshape(4, 256)
    assert dst.ctypes.data % 32 == 16
    rows = np.arange(4)
    digests = np.zeros(1, np.uint64)
    native.copy_rows(dst, rows, src, rows, piece_rows=4, digests=digests, stream=True)
    np.testing.assert_array_equal(dst, src)
    assert int(digests[0]) == xxhash.xxh3_64_intdigest(src.tobytes())


def test_without_digests_it_only_copies() -> None:
    rng = np.random.default_rng(4)
    src = _rows(rng, 8, 512)
    dst = np.zeros_like(src)
    native.copy_rows(dst, np.array([7, 0, 3]), src, np.array([1, 2, 3]), stream=True)
    np.testing.assert_array_equal(dst[[7, 0, 3]], src[[1, 2, 3]])
    assert not dst[[1, 2, 4, 5, 6]].any()


@pytest.mark.parametrize(
    ("dst_rows", "src_rows", "message"),
    [
        ([0, 8], [0, 1], r"dst_rows out of range \[0, 8\)"),
        ([0, 1], [-1, 1], r"src_rows out of range \[0, 4\)"),
        ([0, 1, 2], [0, 1], "3 destination rows for 2 source rows"),
        ([[0, 1]], [[0, 1]], "dst_rows must be one-dimensional"),
    ],
)
def test_bad_rows_are_refused_before_anything_is_copied(
    dst_rows: list[int], src_rows: list[int], message: str
) -> None:
    src = np.ones((4, 256), np.uint8)
    dst = np.zeros((8, 256), np.uint8)
    with pytest.raises(ValueError, match=message):
        native.copy_rows(dst, np.array(dst_rows), src, np.array(src_rows))
    assert not dst.any()


def test_arrays_and_digests_it_does_not_take_are_refused() -> None:
    ok = np.zeros((4, 256), np.uint8)
    rows = np.arange(4)
    assert not native.usable(np.zeros((4, 200), np.uint8), np.zeros((4, 200), np.uint8))
    assert not native.usable(np.zeros((4, 128), np.uint8), np.zeros((4, 128), np.uint8))
    assert not native.usable(np.zeros((4, 512), np.uint8), ok)  # row sizes differ
    assert not native.usable(np.zeros((4, 512), np.uint8)[:, ::2], ok)  # not contiguous
    with pytest.raises(ValueError, match="does not take these arrays"):
        native.copy_rows(np.zeros((4, 192), np.uint8), rows, np.zeros((4, 192), np.uint8), rows)
    read_only = np.zeros((4, 256), np.uint8)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        native.copy_rows(read_only, rows, ok, rows)
    for digests, message in [
        (np.zeros(3, np.uint64), "must be 2 uint64 values"),
        (np.zeros(2, np.int64), "must be 2 uint64 values"),
    ]:
        with pytest.raises(ValueError, match=message):
            native.copy_rows(ok.copy(), rows, ok, rows, piece_rows=2, digests=digests)
    with pytest.raises(ValueError, match="piece_rows must be at least 1"):
        native.copy_rows(ok.copy(), rows, ok, rows, digests=np.zeros(1, np.uint64))


def test_host_copy_names_its_copy_loop() -> None:
    from agentpark.dma import HostCopyTransfer

    assert HostCopyTransfer().copy_loop == f"native kernel, {native.available()}"
    assert HostCopyTransfer(native_copy=False).copy_loop == "numpy"
    assert HostCopyTransfer(hash_thread=True).copy_loop == "numpy + hash thread"
