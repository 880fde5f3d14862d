"""Fixtures of the bench tests: consoles that capture, and directories for the tier files."""

from __future__ import annotations

import io
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from agentpark.bench.common import MEMORY_FILESYSTEMS, filesystem_of
from tests.harness import SHM_ROOT, shm_test_prefix


@dataclass
class Consoles:
    out: Console
    progress: Console
    buffer: io.StringIO

    @property
    def text(self) -> str:
        return self.buffer.getvalue()


@pytest.fixture
def consoles() -> Consoles:
    buffer = io.StringIO()
    return Consoles(Console(file=buffer, width=220), Console(file=io.StringIO(), width=200), buffer)


@pytest.fixture
def shm_parent() -> Iterator[Path]:
    """A private directory under /dev/shm: the bench makes its own temp dir inside."""
    path = Path(tempfile.mkdtemp(prefix=shm_test_prefix() + "bench-", dir=SHM_ROOT))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def disk_parent(tmp_path: Path) -> Iterator[Path]:
    """A private directory on a disk-backed filesystem (tmp_path, else under the cwd)."""
    mount = filesystem_of(tmp_path)
    if mount is None or mount[1] not in MEMORY_FILESYSTEMS:
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="agentpark-benchtest-", dir=Path.cwd()))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
