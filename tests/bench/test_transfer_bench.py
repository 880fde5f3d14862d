"""``agentpark bench transfer`` runs end to end on tiny sizes, for every tier, cleans up after
itself, and fails on a restore that is not bit-exact."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, TypeVar

import jax
import numpy as np
import pytest

import agentpark.dma
import agentpark.dma.select
import agentpark.parts
from agentpark.bench import transfer as bench
from agentpark.bench.common import filesystem_of, first_mismatch
from agentpark.bench.transfer import daemon_parts, geometry, run, verdicts
from agentpark.dma.host_copy import HostCopyTransfer
from agentpark.dma.jax_memkind import JaxMemkindTransfer

from .conftest import Consoles

MiB = 1 << 20
SPREAD = r"\d+\.\d\d \(\d+\.\d\d-\d+\.\d\d\)"


def _rows(text: str, size: str) -> list[str]:
    return [line for line in text.splitlines() if re.search(rf"│\s*{size}\s*│", line)]


def _directory(tier: str, shm_parent: Path, disk_parent: Path) -> Path | None:
    return {"dram": None, "shm": shm_parent, "disk": disk_parent}[tier]


@pytest.mark.parametrize("tier", bench.TIERS)
def test_each_tier_prints_a_row_per_size_and_round_trips_bit_exact(
    tier: str, consoles: Consoles, shm_parent: Path, disk_parent: Path
) -> None:
    directory = _directory(tier, shm_parent, disk_parent)
    code = bench.run_transfer_bench(
        [1 * MiB, 2 * MiB],
        repeats=2,
        tier=tier,
        directory=directory,
        console=consoles.out,
        progress_console=consoles.progress,
    )
    text = consoles.text
    assert code == 0, text
    assert f"--tier {tier}" in text and "pause ratio" in text and "restore ratio" in text
    # Disk adds the plain file write and read, and the ratios to them.
    per_row = 9 if tier == "disk" else 5
    for size in ("1 MiB", "2 MiB"):
        rows = _rows(text, size)
        table_row, checksum_row, alone_row, paths_row, restore_row, *copier_rows = rows
        assert len(re.findall(SPREAD, table_row)) == per_row, table_row
        assert "yes" in table_row  # bit-exact, checked before and after the repeats
        # Checksum on: pause and restore GB/s and ratios, xxh3 alone, then what the checksum
        # adds to a pause and a restore.
        assert len(re.findall(SPREAD, checksum_row)) == 5, checksum_row
        assert len(re.findall(r"[+-]\d+%", checksum_row)) == 2, checksum_row
        # The copy alone: pause and restore ratios, checksum off and on.
        assert len(re.findall(SPREAD, alone_row)) == 4, alone_row
        # Checksum on, the copy alone: pause and restore, fused and on the hash thread.
        assert len(re.findall(SPREAD, paths_row)) == 4, paths_row
        # The restore alone, in place and through XLA, checksum off and on.
        assert len(re.findall(SPREAD, restore_row)) == 4, restore_row
        # The copy alone through the native kernel, then numpy: off and on, both ways.
        assert [row.split("│")[2].strip() for row in copier_rows] == ["kernel", "numpy"]
        assert all(len(re.findall(SPREAD, row)) == 4 for row in copier_rows), copier_rows
    assert "what the checksum costs" in text and "the copy alone" in text
    assert "in place vs XLA" in text and "restores here went in place." in text
    assert "native kernel vs numpy" in text
    assert re.search(r"the native kernel \((avx2|portable) path\) copies and hashes", text)
    assert "no size to judge" in text  # both sizes are below the 256 MiB target threshold
    if tier == "disk":
        assert "page cache" in text and "write GB/s" in text and "pause/write" in text
    if directory is not None:
        # The bench's temporary directory (and the tier file in it) is gone.
        assert list(directory.iterdir()) == []
        assert f"{tier} tier file in {directory}/agentpark-bench-" in text


def test_jax_memkind_prints_a_row_per_size_against_a_pinned_device_put(
    consoles: Consoles,
) -> None:
    code = bench.run_transfer_bench(
        [1 * MiB, 2 * MiB],
        repeats=2,
        console=consoles.out,
        progress_console=consoles.progress,
        backend="jax_memkind",
    )
    text = consoles.text
    assert code == 0, text
    assert "--backend jax_memkind" in text and "vs a plain pinned jax.device_put" in text
    assert "put d2h GB/s" in text and "put h2d GB/s" in text and "copyto GB/s" not in text
    for size in ("1 MiB", "2 MiB"):
        table_row, alone_row = _rows(text, size)  # checksum off only: no checksum tables
        # pause, restore, the two references (d2h and h2d), pause and restore ratios.
        assert len(re.findall(SPREAD, table_row)) == 6, table_row
        assert "yes" in table_row  # bit-exact, checked before and after the repeats
        assert len(re.findall(SPREAD, alone_row)) == 2, alone_row
    assert "JaxMemkindTransfer.d2h/h2d" in text and "what the checksum costs" not in text
    # Self-describing: where it ran, and that a CPU run says nothing about a GPU.
    assert "dma jax_memkind" in text
    assert f"JAX platform 'cpu', device {jax.devices()[0].device_kind!r}" in text
    assert "say nothing about a GPU" in text
    target = "ratio >= 0.9 of a plain pinned jax.device_put of the same bytes"
    assert f"target: {target}" in text and f"the copy alone: {target}" in text
    assert "no size to judge" in text  # both sizes are below the 256 MiB target threshold


def test_pinned_put_moves_the_bytes_between_memory_kinds() -> None:
    put = bench.PinnedPut(1 * MiB, jax.devices()[0])
    assert put.on_device is not None and put.on_host is not None
    assert put.on_device.sharding.memory_kind == "device"
    assert put.on_host.sharding.memory_kind == "pinned_host"
    assert put.on_host.nbytes == 1 * MiB
    assert np.all(np.asarray(put.on_host) == 1)
    put.d2h()
    put.h2d()
    put.close()
    assert put.on_device is None and put.on_host is None


def test_jax_memkind_without_pinned_host_exits_2_with_a_message(
    consoles: Consoles, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A JAX whose device has no pinned_host memory kind (older CPU builds).
    monkeypatch.setattr(agentpark.dma.select, "_memory_kinds", lambda: {"device", "unpinned_host"})
    err = Consoles(consoles.progress, consoles.out, consoles.buffer)  # capture the error
    code = bench.run_transfer_bench(
        [1 * MiB], 1, console=err.out, progress_console=err.progress, backend="jax_memkind"
    )
    assert code == 2
    assert "--backend jax_memkind" in err.text and "no 'pinned_host' memory kind" in err.text
    assert "Traceback" not in err.text


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ({"copy_threads": 2}, "--copy-threads"),
        ({"hash_thread": True}, "--hash-thread"),
    ],
)
def test_jax_memkind_refuses_host_copy_flags(
    consoles: Consoles, flags: dict[str, Any], says: str
) -> None:
    err = Consoles(consoles.progress, consoles.out, consoles.buffer)  # capture the error
    code = bench.run_transfer_bench(
        [1 * MiB], 1, console=err.out, progress_console=err.progress, backend="jax_memkind", **flags
    )
    assert code == 2
    assert says in err.text and "--backend jax_memkind" in err.text


T = TypeVar("T")


def _corrupting_restores(base: type[T], monkeypatch: pytest.MonkeyPatch) -> type[T]:
    """A ``base`` transfer that flips one bit of the first block it restores into the
    bench's engine (not the scratch fill); the bench's stacks report their tier to it."""
    engine_tier: list[object] = [None]

    class Corrupting(base):  # type: ignore[valid-type, misc]
        def h2d(self, tier, slots, engine, block_ids, digest=False):  # type: ignore[no-untyped-def]
            got = super().h2d(tier, slots, engine, block_ids, digest)
            if tier is not engine_tier[0]:
                return got  # the scratch fill: leave it alone
            with engine.lock:
                (pool,) = engine.kv_pool()
                engine.set_kv_pool([pool.at[block_ids[0], 0, 0, 0, 0, 0].add(1)])
            return got

    real_stack_build = daemon_parts.Stack.build

    def build(*args: Any, **kwargs: Any) -> daemon_parts.Stack:
        stack = real_stack_build(*args, **kwargs)
        engine_tier[0] = stack.tier
        return stack

    monkeypatch.setattr(daemon_parts.Stack, "build", build)
    return Corrupting


def test_jax_memkind_fails_the_bench_on_a_restore_that_is_not_bit_exact(
    consoles: Consoles, monkeypatch: pytest.MonkeyPatch
) -> None:
    Corrupting = _corrupting_restores(JaxMemkindTransfer, monkeypatch)
    real_select = agentpark.dma.select_transfer

    def select(backend: str, **kwargs: Any) -> Any:
        real = real_select(backend, **kwargs)  # the real platform check
        return Corrupting() if backend == "jax_memkind" else real

    # The bench builds its backend the daemon's way (agentpark.parts): patched there.
    monkeypatch.setattr(agentpark.parts, "select_transfer", select)
    code = bench.run_transfer_bench(
        [1 * MiB],
        repeats=1,
        console=consoles.out,
        progress_console=consoles.progress,
        backend="jax_memkind",
    )
    text = consoles.text
    assert code == 1, text
    assert "not bit-exact" in text and "after warm-up" in text


def test_verdict_judges_jax_memkind_against_the_pinned_put() -> None:
    big = 256 * MiB
    near = bench.SizeResult(big, "dram", pause_s=[1.0], restore_s=[1.0], backend="jax_memkind")
    near.copy_before_pause_s, near.copy_before_restore_s = [0.92], [0.95]
    assert verdicts.verdict("dram", [near], "jax_memkind").endswith("met")  # 0.92 >= 0.9
    far = bench.SizeResult(big, "dram", pause_s=[1.0], restore_s=[1.0], backend="jax_memkind")
    far.copy_before_pause_s, far.copy_before_restore_s = [0.95], [0.85]
    verdict = verdicts.verdict("dram", [far], "jax_memkind")
    assert "MISSED: restore at 256 MiB (0.85)" in verdict and "pause at" not in verdict
    assert "ratio >= 0.9 of a plain pinned jax.device_put" in verdict
    # The same figures judged as host_copy's (0.95 of np.copyto) miss the pause.
    as_host_copy = dataclasses.replace(near, backend="host_copy")
    assert verdicts.verdict("dram", [as_host_copy]).endswith("MISSED: pause at 256 MiB (0.92)")


def test_copy_threads_add_ratios_to_a_threaded_memcpy(consoles: Consoles) -> None:
    code = bench.run_transfer_bench(
        [2 * MiB],
        repeats=2,
        console=consoles.out,
        progress_console=consoles.progress,
        copy_threads=2,
    )
    text = consoles.text
    assert code == 0, text
    assert "copyto x2 GB/s" in text and "pause/x2" in text and "dma.copy_threads = 2" in text
    table_row, checksum_row, alone_row, paths_row, restore_row, *_ = _rows(text, "2 MiB")
    assert len(re.findall(SPREAD, table_row)) == 5 + 3, table_row
    assert len(re.findall(SPREAD, checksum_row)) == 5 + 2, checksum_row
    assert len(re.findall(SPREAD, alone_row)) == 4 + 4, alone_row
    assert len(re.findall(SPREAD, paths_row)) == 4, paths_row
    assert len(re.findall(SPREAD, restore_row)) == 4 + 4, restore_row


@pytest.mark.parametrize("hash_thread", [False, True])
def test_hash_thread_names_the_path_and_times_both(consoles: Consoles, hash_thread: bool) -> None:
    code = bench.run_transfer_bench(
        [8 * MiB],  # more than one 4 MiB span: the hash thread is used
        repeats=1,
        console=consoles.out,
        progress_console=consoles.progress,
        hash_thread=hash_thread,
    )
    text = consoles.text
    assert code == 0, text
    assert f"dma.hash_thread = {str(hash_thread).lower()}, dma.native_copy = true" in text
    path = "hash thread" if hash_thread else "fused"
    assert f"pause+xxh3 ({path})" in text and "fused vs hash thread" in text
    paths_row = _rows(text, "8 MiB")[3]
    assert len(re.findall(SPREAD, paths_row)) == 4, paths_row


def test_without_the_native_copy_numpy_copies_and_the_kernel_is_timed_beside_it(
    consoles: Consoles,
) -> None:
    code = bench.run_transfer_bench(
        [2 * MiB],
        repeats=1,
        console=consoles.out,
        progress_console=consoles.progress,
        native_copy=False,
    )
    text = consoles.text
    assert code == 0, text
    assert "dma.hash_thread = false, dma.native_copy = false: numpy copies" in text
    *_, kernel_row, numpy_row = _rows(text, "2 MiB")
    assert "kernel" in kernel_row and "numpy" in numpy_row
    assert all(len(re.findall(SPREAD, row)) == 4 for row in (kernel_row, numpy_row))


def test_hash_thread_with_tpu_sync_exits_2(consoles: Consoles) -> None:
    err = Consoles(consoles.progress, consoles.out, consoles.buffer)  # capture the error
    code = bench.run_transfer_bench(
        [1 * MiB],
        1,
        console=err.out,
        progress_console=err.progress,
        backend="tpu_sync",
        hash_thread=True,
    )
    assert code == 2
    assert "--hash-thread" in err.text


def test_copy_threads_out_of_range_exit_2(consoles: Consoles) -> None:
    code = bench.run_transfer_bench(
        [1 * MiB], 1, console=consoles.out, progress_console=consoles.progress, copy_threads=0
    )
    assert code == 2


def test_shm_files_live_in_memory(consoles: Consoles, shm_parent: Path) -> None:
    assert Path("/dev/shm") == bench.SHM_ROOT
    code = bench.run_transfer_bench(
        [1 * MiB],
        repeats=1,
        tier="shm",
        directory=shm_parent,
        console=consoles.out,
        progress_console=consoles.progress,
    )
    assert code == 0, consoles.text
    assert "(tmpfs on /dev/shm)" in consoles.text


def test_disk_refuses_a_memory_filesystem(consoles: Consoles, shm_parent: Path) -> None:
    err = Consoles(consoles.progress, consoles.out, consoles.buffer)  # capture the error
    code = bench.run_transfer_bench(
        [1 * MiB],
        repeats=1,
        tier="disk",
        directory=shm_parent,
        console=err.out,
        progress_console=err.progress,
    )
    assert code == 2
    assert "memory, not a disk" in err.text
    assert list(shm_parent.iterdir()) == []


@pytest.mark.parametrize("tier", ["shm", "disk"])
def test_tier_files_are_removed_when_the_bench_fails(
    tier: str,
    consoles: Consoles,
    shm_parent: Path,
    disk_parent: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory = _directory(tier, shm_parent, disk_parent)
    assert directory is not None
    seen: list[Path] = []

    def boom(stack: Any, *args: Any) -> None:
        seen.extend(directory.rglob("*"))  # the tier file exists while the bench runs
        raise RuntimeError("injected failure")

    monkeypatch.setattr(run, "bench_size", boom)
    with pytest.raises(RuntimeError, match="injected failure"):
        bench.run_transfer_bench(
            [1 * MiB],
            repeats=1,
            tier=tier,
            directory=directory,
            console=consoles.out,
            progress_console=consoles.progress,
        )
    assert any(p.name == f"{tier}-tier.bin" for p in seen), seen
    assert list(directory.iterdir()) == []


@pytest.mark.parametrize("tier", bench.TIERS)
def test_a_restore_that_is_not_bit_exact_fails_the_bench(
    tier: str,
    consoles: Consoles,
    shm_parent: Path,
    disk_parent: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    Corrupting = _corrupting_restores(HostCopyTransfer, monkeypatch)
    monkeypatch.setattr(agentpark.dma.select, "HostCopyTransfer", Corrupting)
    directory = _directory(tier, shm_parent, disk_parent)
    code = bench.run_transfer_bench(
        [1 * MiB],
        repeats=1,
        tier=tier,
        directory=directory,
        console=consoles.out,
        progress_console=consoles.progress,
    )
    text = consoles.text
    assert code == 1, text
    assert "not bit-exact" in text and "after warm-up" in text
    if directory is not None:
        assert list(directory.iterdir()) == []


def test_default_consoles_print_the_table_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.run_transfer_bench([1 * MiB], repeats=1) == 0
    captured = capsys.readouterr()
    assert "1 MiB" in captured.out and "restore ratio" in captured.out
    assert "restore ratio" not in captured.err


def test_plain_file_round_trips_and_is_removed(tmp_path: Path) -> None:
    size = 3 * MiB + 4096
    plain = bench.PlainFile(tmp_path / "plain.bin", size)
    src = np.frombuffer(np.random.default_rng(1).bytes(size), dtype=np.uint8).copy()
    dst = np.zeros(size, dtype=np.uint8)
    plain.write(src)
    plain.read(dst)
    assert np.array_equal(src, dst)
    assert (tmp_path / "plain.bin").stat().st_size == size
    plain.close()
    assert not (tmp_path / "plain.bin").exists()


def test_filesystem_of_picks_the_deepest_mount() -> None:
    mounts = "\n".join(
        [
            "/dev/vda / ext4 rw 0 0",
            "tmpfs /scratch tmpfs rw 0 0",
            "tmpfs /dev/shm tmpfs rw 0 0",
            r"/dev/vdb /mnt/my\040disk xfs rw 0 0",
        ]
    )
    assert filesystem_of(Path("/scratch/x/y"), mounts) == ("/scratch", "tmpfs")
    assert filesystem_of(Path("/scratchfoo"), mounts) == ("/", "ext4")
    assert filesystem_of(Path("/mnt/my disk/a"), mounts) == ("/mnt/my disk", "xfs")
    assert filesystem_of(Path("/dev/shm"), mounts) == ("/dev/shm", "tmpfs")
    assert filesystem_of(Path("/dev/shm"), "") is None


def test_first_mismatch_finds_a_single_flipped_bit() -> None:
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 1 << 16, size=(8, 2, 3, 4), dtype=np.uint16)
    block_ids = [5, 2, 7]
    expected = [pool[block_ids].copy()]
    assert first_mismatch(expected, [pool], block_ids) is None
    corrupted = pool.copy()
    corrupted[7, 1, 2, 3] ^= 1 << 9
    why = first_mismatch(expected, [corrupted], block_ids)
    assert why is not None and "pool block 7" in why and "1 bytes differ" in why
    assert first_mismatch(expected, [pool], [5, 7, 2]) is not None  # wrong order
    assert first_mismatch(expected, [pool, pool], block_ids) is not None


def test_nan_bit_patterns_are_compared_as_bits() -> None:
    pool = np.full((2, 4), np.nan, dtype=np.float32)
    expected = [pool.copy()]
    assert first_mismatch(expected, [pool], [0, 1]) is None  # NaN == NaN bitwise
    pool.view(np.uint32)[1, 0] ^= 1  # another NaN payload: still NaN, different bits
    assert first_mismatch(expected, [pool], [0, 1]) is not None


@pytest.mark.parametrize(
    ("sizes", "repeats", "tier", "directory"),
    [
        ([3 * 1024], 1, "dram", None),
        ([1 * MiB], 0, "dram", None),
        ([], 1, "dram", None),
        ([0], 1, "dram", None),
        ([1 * MiB], 1, "nvme", None),
        ([1 * MiB], 1, "dram", Path("/")),  # --dir is for the file tiers
        ([1 * MiB], 1, "disk", Path("/nonexistent/agentpark")),
    ],
)
def test_unmeasurable_arguments_exit_2(
    sizes: list[int], repeats: int, tier: str, directory: Path | None, consoles: Consoles
) -> None:
    code = bench.run_transfer_bench(
        sizes,
        repeats,
        tier=tier,
        directory=directory,
        console=consoles.out,
        progress_console=consoles.progress,
    )
    assert code == 2


def test_block_size_divides_every_size() -> None:
    token = geometry.TOKEN_BYTES
    assert geometry.block_tokens([64 * MiB, 256 * MiB, 1 << 30]) == geometry.MAX_BLOCK_TOKENS
    assert geometry.block_tokens([3 * token, 64 * MiB]) == 1
    assert geometry.block_tokens([48 * token]) == 16


def test_verdict_judges_disk_against_the_plain_file() -> None:
    big = 256 * MiB
    fast = bench.SizeResult(big, "disk", pause_s=[1.0], restore_s=[1.0])
    fast.copy_before_pause_s = fast.copy_before_restore_s = [0.1]  # memcpy 10x faster
    fast.file_write_s, fast.file_read_s = [1.1], [0.9]
    assert verdicts.verdict("disk", [fast]).endswith("met")
    slow = bench.SizeResult(big, "disk", pause_s=[2.0], restore_s=[1.0])
    slow.copy_before_pause_s = slow.copy_before_restore_s = [1.0]
    slow.file_write_s, slow.file_read_s = [1.0], [1.0]
    assert "MISSED: pause/file write at 256 MiB (0.50)" in verdicts.verdict("disk", [slow])
    dram = bench.SizeResult(big, "dram", pause_s=[1.0], restore_s=[1.0])
    dram.copy_before_pause_s, dram.copy_before_restore_s = [0.8], [0.96]
    assert "MISSED: pause at 256 MiB (0.80)" in verdicts.verdict("dram", [dram])
    assert "restore" not in verdicts.verdict("dram", [dram]).split("MISSED")[1]
    # With the checksum on: judged against the same single-thread np.copyto.
    on = dram.op("pause+xxh3")
    on.s, on.ref1 = [1.0], [0.7]
    assert "pause+xxh3 at 256 MiB (0.70)" in verdicts.verdict("dram", [dram])
