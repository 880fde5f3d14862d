"""TPU Sync's own /dev/shm warm boot, hardened for agentpark (the daemon's tpu_sync backend and
the connector's TPU worker both use it; light: no JAX, nothing of the daemon).

Warm boot (surviving kill -9) goes through TPU Sync's OWN shm mode, hardened
(:class:`TpuSyncShm`), because agentpark's shm tier cannot hold these bytes: TPU Sync has no
API to read its host blocks, and on a TPU they are in its tiled layout. With
``enable_shm=True`` and ``RAIDEN_SHM_KEY=k`` it keeps its host blocks in ``/dev/shm/k_dev_<n>``
(+ ``.lock``), and a new process with the same key finds them again. Left alone that mode is
unsafe for agentpark, so :class:`TpuSyncShm`:

* chooses the key itself (from the state directory) and sets ``RAIDEN_SHM_KEY`` only while
  the manager is built; a ``RAIDEN_SHM_KEY`` set from outside is refused;
* builds under umask 077: TPU Sync creates the segments with the process umask (0644 under
  the usual 022, i.e. every local user could read every agent's context; 0666 under 000),
  then checks they are regular files of this uid with mode 0600, before and after;
* records the layout (model uid, pool arrays, host blocks, TPU Sync version) in a 0600
  file in the state directory and refuses to hand existing segments to TPU Sync unless it
  matches, because TPU Sync silently ZEROES segments whose layout differs (checked: a wider
  block, or more host blocks, read back zeros, and the original layout then reads zeros
  too). Refused segments are moved aside, never deleted, and the tier starts empty (its
  sessions become LOST and are recomputed), as agentpark's own shm tier does.

What this cannot give: a checksum of the parked bytes (agentpark cannot read them), so a
copy corrupted in /dev/shm by this uid is not detected.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentpark.blocks import PoolGeometry
from agentpark.errors import TransferError
from agentpark.tiers.aside import move_aside

__all__ = ["SHM_ENV", "SHM_RECORD", "SHM_ROOT", "TpuSyncShm", "tpu_sync_version"]

log = logging.getLogger(__name__)

SHM_ENV = "RAIDEN_SHM_KEY"
SHM_ROOT = Path("/dev/shm")
SHM_RECORD = "tpu_sync-shm.json"
"""The layout record of TPU Sync's segments, in the state directory."""


def tpu_sync_version() -> str:
    try:
        return importlib.metadata.version("tpu-sync-jax")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


class TpuSyncShm:
    """TPU Sync's /dev/shm warm boot, made safe enough for agentpark (module docstring).

    ``prepare()`` runs before the manager is built and decides whether existing segments
    may be handed to TPU Sync (``reattached``) or are moved aside (``attach_problem``);
    ``building()`` wraps the build (key in the environment, umask 077); ``commit()`` runs
    after it, checks the segments and writes the layout record.
    """

    def __init__(self, state_dir: Path, *, key: str | None = None, root: Path = SHM_ROOT):
        self.state_dir = Path(state_dir)
        digest = hashlib.sha256(str(self.state_dir.resolve()).encode()).hexdigest()[:16]
        self.key = key or f"agentpark-{digest}"
        self.root = Path(root)
        self.record_path = self.state_dir / SHM_RECORD
        self.reattached = False
        self.attach_problem: str | None = None

    def segments(self) -> list[Path]:
        """TPU Sync's files for this key (``<key>_dev_<n>`` and their ``.lock``)."""
        return sorted(self.root.glob(f"{self.key}_dev_*"))

    def layout(self, geometry: PoolGeometry, model_uid: str, host_blocks: int) -> dict[str, Any]:
        return {
            "format": 1,
            "key": self.key,
            "model_uid": model_uid,
            "block_size": geometry.block_size,
            "arrays": [[list(a.block_shape), str(a.dtype)] for a in geometry.arrays],
            "host_blocks": host_blocks,
            "tpu_sync": tpu_sync_version(),
        }

    def prepare(self, layout: dict[str, Any]) -> None:
        """Decide about existing segments BEFORE TPU Sync sees them (it zeroes mismatches)."""
        self.reattached, self.attach_problem = False, None
        existing = self.segments()
        if not existing:
            return
        problem = self._mismatch(existing, layout)
        if problem is None:
            self.reattached = True
            log.info("tpu_sync shm: re-attaching %s", ", ".join(map(str, existing)))
            return
        for path in existing:
            move_aside(path, f"tpu_sync shm: {problem}")
        self.record_path.unlink(missing_ok=True)
        self.attach_problem = f"{existing[0]}: {problem}"
        log.error(
            "tpu_sync shm: refusing to attach %s: %s; moved aside, starting empty",
            ", ".join(map(str, existing)),
            problem,
        )

    @contextlib.contextmanager
    def building(self) -> Iterator[None]:
        """The build's surroundings: ``RAIDEN_SHM_KEY`` = our key, umask 077 (process-wide)."""
        if os.environ.get(SHM_ENV):
            raise TransferError(
                f"{SHM_ENV} is set from outside: agentpark chooses TPU Sync's shm key itself "
                "(dma.tpu_sync_shm); unset it"
            )
        old_umask = os.umask(0o077)
        os.environ[SHM_ENV] = self.key
        try:
            yield
        finally:
            os.environ.pop(SHM_ENV, None)
            os.umask(old_umask)

    def commit(self, layout: dict[str, Any]) -> None:
        """After the build: the segments must exist and be ours; record their layout."""
        existing = [p for p in self.segments() if not p.name.endswith(".lock")]
        if not existing:
            raise TransferError(
                f"TPU Sync made no /dev/shm segment for key {self.key!r} with enable_shm"
            )
        for path in self.segments():
            problem = _not_private(path)
            if problem:
                raise TransferError(f"TPU Sync's segment {path} is {problem}")
        tmp = self.record_path.with_name(self.record_path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(layout, out, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.record_path)

    def _mismatch(self, existing: list[Path], layout: dict[str, Any]) -> str | None:
        for path in existing:
            problem = _not_private(path)
            if problem:
                return problem
        try:
            recorded = json.loads(self.record_path.read_text())
        except FileNotFoundError:
            return f"no layout record {self.record_path} (segments of unknown layout)"
        except (OSError, ValueError) as exc:
            return f"unreadable layout record {self.record_path}: {exc}"
        problem = _not_private(self.record_path)
        if problem:
            return f"layout record {problem}"
        for key, value in layout.items():
            if recorded.get(key) != value:
                return f"{key} is {recorded.get(key)!r}, this daemon has {value!r}"
        return None


def _not_private(path: Path) -> str | None:
    """Why ``path`` is not a regular file of this uid with mode 0600 (None when it is)."""
    st = path.lstat()
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not this daemon's uid {os.geteuid()}"
    if st.st_mode & 0o077:
        return f"mode {st.st_mode & 0o777:o}, not 0600"
    return None
