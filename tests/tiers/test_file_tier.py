"""The file tier's own guarantees: a header for any layout, descriptors closed once, and a
file that shrank, changed or was replaced never touched through the old mapping."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest

from agentpark.blocks import ArraySpec, PoolGeometry
from agentpark.errors import TransferError
from agentpark.tiers.disk import DiskTier
from agentpark.tiers.filetier import FileTier
from agentpark.tiers.header import read_header
from agentpark.tiers.shm import ShmTier

BLOCK = 16


def _geometry(n_arrays: int) -> PoolGeometry:
    arrays = tuple(ArraySpec((1, 2, BLOCK, 1, 4), "uint16") for _ in range(n_arrays))
    return PoolGeometry(8, BLOCK, arrays)


@pytest.mark.parametrize("n_arrays", [2, 40, 80, 256])
def test_any_number_of_arrays_fits_the_header_and_re_attaches(n_arrays: int, shm_dir: Path) -> None:
    geometry = _geometry(n_arrays)
    capacity = 4 * geometry.block_nbytes
    tier = ShmTier(shm_dir / "tier", geometry, capacity, "m")
    try:
        assert read_header(tier.path)["arrays"] == tier.expected_header()["arrays"]
        assert tier.region_offsets[0] == tier.header_bytes >= 4096
        assert tier.path.stat().st_size == tier.file_bytes
        arrays = enumerate(geometry.arrays)
        rows = [np.full((4, *a.block_shape), i, dtype=a.dtype) for i, a in arrays]
        for buf, row in zip(tier.buffers(), rows, strict=True):
            buf[:] = row
        del buf  # a live view keeps the map (and its lock) open after close
    finally:
        tier.close()
    again = ShmTier(shm_dir / "tier", geometry, capacity, "m")
    try:
        assert again.reattached and again.attach_problem is None
        assert all(np.array_equal(buf, row) for buf, row in zip(again.buffers(), rows, strict=True))
    finally:
        again.close()


def test_close_twice_never_closes_a_descriptor_that_is_someone_elses(shm_dir: Path) -> None:
    tier = ShmTier(shm_dir / "tier", _geometry(2), 4 * _geometry(2).block_nbytes, "m")
    tier.close()
    a, b = socket.socketpair()  # takes the lowest free numbers: the tier's old fd among them
    try:
        tier.close()
        tier.close()
        a.sendall(b"still open")
        assert b.recv(16) == b"still open"
    finally:
        a.close()
        b.close()


def test_a_reopen_that_fails_leaves_nothing_to_close_twice(shm_dir: Path) -> None:
    path = shm_dir / "tier"
    geometry = _geometry(2)
    tier = ShmTier(path, geometry, 4 * geometry.block_nbytes, "m")
    path.unlink()
    assert tier.notice() is not None
    (shm_dir / "gone").mkdir()
    os.rename(shm_dir, shm_dir.with_name(shm_dir.name + "-x"))  # its folder gone: no remake
    try:
        with pytest.raises(Exception, match="folder"):
            tier.reopen()
        tier.close()
        tier.close()
    finally:
        os.rename(shm_dir.with_name(shm_dir.name + "-x"), shm_dir)


@pytest.mark.parametrize("tier_class", [ShmTier, DiskTier])
def test_a_shrunk_file_is_refused_before_its_mapping_is_touched(
    tier_class: type[FileTier], shm_dir: Path, tmp_path: Path
) -> None:
    folder = shm_dir if tier_class is ShmTier else tmp_path
    geometry = _geometry(2)
    tier = tier_class(folder / "tier", geometry, 4 * geometry.block_nbytes, "m")  # type: ignore[call-arg]
    try:
        os.truncate(tier.path, 4096)
        with pytest.raises(TransferError, match="shrank"):
            tier.buffers()  # before the change: the mapping, then SIGBUS on a copy
        assert tier.gone is not None and "shrank" in tier.gone
        tier.reopen()  # moved aside, a new whole file made
        assert tier.path.stat().st_size == tier.file_bytes and tier.gone is None
        tier.buffers()[0][:] = 1
    finally:
        tier.close()


def test_a_changed_mode_or_a_symlink_is_noticed(shm_dir: Path, tmp_path: Path) -> None:
    geometry = _geometry(2)
    tier = ShmTier(shm_dir / "tier", geometry, 4 * geometry.block_nbytes, "m")
    try:
        os.chmod(tier.path, 0o644)
        assert "mode" in (tier.missing() or "")
        os.chmod(tier.path, 0o600)
        assert tier.missing() is None
        target = tmp_path / "elsewhere"
        target.write_bytes(b"x")
        link = shm_dir / "link"
        link.symlink_to(target)
        os.replace(link, tier.path)
        assert "symlink" in (tier.missing() or "")
    finally:
        tier.close()


def test_a_symlink_at_the_path_is_moved_aside_never_followed(shm_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"do not touch")
    (shm_dir / "tier").symlink_to(target)
    geometry = _geometry(2)
    tier = ShmTier(shm_dir / "tier", geometry, 4 * geometry.block_nbytes, "m")
    try:
        assert not tier.path.is_symlink() and tier.attach_problem is not None
        assert target.read_bytes() == b"do not touch"
        (aside,) = [p for p in shm_dir.iterdir() if ".mismatch-" in p.name]
        assert aside.is_symlink()  # moved as it was
    finally:
        tier.close()
