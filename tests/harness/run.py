"""What a test run sets up once and checks at its end: its /dev/shm folders and JAX's cache.

JAX's persistent compilation cache, for this test run only (never the product's default):
the run's processes (pytest-xdist workers, `agentpark serve` children, which inherit the
environment) then compile each step shape once between them. A fresh directory per run, so
nothing compiled by an earlier run or another checkout is ever loaded.

No tier file is left behind: every /dev/shm folder the tests make is named
:func:`shm_test_prefix` + ...: the run's own tag (made by the controller, inherited by the
xdist workers and daemon children) tells this run's folders from those of another run on
the same machine. A tier file at the default shm path carries its state dir in its header,
which for a test is under the run's basetemp. The controller checks both once every worker
is done, fails the run on a leak, and removes what it found (each leak is hundreds of MiB
of RAM on a real config).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "SHM_ROOT",
    "configure_run",
    "leaked_shm",
    "private_shm_dir",
    "remove_leaks",
    "shm_test_prefix",
    "unconfigure_run",
]

_JAX_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
_SHM_TAG_ENV = "PYTEST_AGENTPARK_SHM_TAG"
SHM_ROOT = Path("/dev/shm")
_jax_cache_dir: Path | None = None


def configure_run(controller: bool) -> None:
    """Point JAX at the run's compilation cache; the controller makes it and the shm tag."""
    import jax

    global _jax_cache_dir
    if controller:
        _jax_cache_dir = Path(tempfile.mkdtemp(prefix="agentpark-test-jax-cache-"))
        os.environ[_JAX_CACHE_ENV] = str(_jax_cache_dir)
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # cache every step
        # A size limit turns on the cache's file lock: processes write it concurrently.
        os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(1 << 30)
        os.environ[_SHM_TAG_ENV] = os.urandom(4).hex()  # this run's /dev/shm folders
    # This process imported jax before the variables were set (a worker inherits them).
    jax.config.update("jax_compilation_cache_dir", os.environ[_JAX_CACHE_ENV])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_compilation_cache_max_size", 1 << 30)


def unconfigure_run() -> None:
    """Remove the run's compilation cache (the controller's; a worker made none)."""
    if _jax_cache_dir is not None:
        shutil.rmtree(_jax_cache_dir, ignore_errors=True)


def shm_test_prefix() -> str:
    """The name prefix of this run's folders under /dev/shm."""
    return f"agentpark-test-{os.environ[_SHM_TAG_ENV]}-"


@contextmanager
def private_shm_dir() -> Iterator[Path]:
    """A private directory under /dev/shm (real shared memory), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=shm_test_prefix(), dir=SHM_ROOT))
    try:
        yield path
    finally:
        # A daemon thread finishing its shutdown may still make a file in here (a tier
        # file noticed gone is made again) while rmtree runs; a few passes get both.
        for _ in range(5):
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                break


def leaked_shm(basetemp: Path) -> list[Path]:
    """This run's folders under /dev/shm, and tier files whose state dir is the run's."""
    from agentpark.tiers.filetier import read_header

    leaked: list[Path] = []
    for entry in sorted(SHM_ROOT.glob("agentpark-*")):
        if entry.name.startswith(shm_test_prefix()):
            leaked.append(entry)
            continue
        if entry.is_symlink():
            continue
        # A daemon's private shm folder (tiers.shm.shm_dir) leaks with the files in it.
        inside = sorted(entry.iterdir()) if entry.is_dir() else [entry]
        for path in inside:
            if not path.is_file() or path.is_symlink():
                continue
            try:
                owner = read_header(path).get("state_dir")
            except (ValueError, OSError):
                continue
            if owner and Path(owner).is_relative_to(basetemp.resolve()):
                leaked.append(entry)
                break
    return leaked


def remove_leaks(basetemp: Path) -> bool:
    """Whether the run left anything in /dev/shm; says what and removes it."""
    leaked = leaked_shm(basetemp)
    if leaked:
        lines = "\n".join(f"  {path}" for path in leaked)
        print(f"\nthe test run left these in {SHM_ROOT} (now removed):\n{lines}")
    for path in leaked:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return bool(leaked)
