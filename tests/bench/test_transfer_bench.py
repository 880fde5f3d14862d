"""``agentpark bench transfer`` runs end to end on tiny sizes and fails on a bad restore."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from rich.console import Console

from agentpark.bench import transfer as bench
from agentpark.dma.host_copy import HostCopyTransfer

MiB = 1 << 20


def _consoles() -> tuple[Console, io.StringIO, Console]:
    out = io.StringIO()
    return Console(file=out, width=200), out, Console(file=io.StringIO(), width=200)


def test_tiny_bench_prints_a_row_per_size_with_ratios() -> None:
    console, out, progress = _consoles()
    code = bench.run_transfer_bench(
        [1 * MiB, 4 * MiB], repeats=2, console=console, progress_console=progress
    )
    text = out.getvalue()
    assert code == 0, text
    assert "pause ratio" in text and "restore ratio" in text
    for size in ("1 MiB", "4 MiB"):
        rows = [line for line in text.splitlines() if re.search(rf"│\s*{size}\s*│", line)]
        assert len(rows) == 1, text
        # 3 GB/s cells and 2 ratio cells: "median (min-max)", then bit-exact "yes".
        cells = re.findall(r"\d+\.\d\d \(\d+\.\d\d-\d+\.\d\d\)", rows[0])
        assert len(cells) == 5, rows[0]
        assert "yes" in rows[0]
    assert "no size to judge" in text  # both sizes are below the 256 MiB target threshold


def test_default_consoles_print_the_table_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.run_transfer_bench([1 * MiB], repeats=1) == 0
    captured = capsys.readouterr()
    assert "1 MiB" in captured.out and "restore ratio" in captured.out


def test_a_restore_that_is_not_bit_exact_fails_the_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    class Corrupting(HostCopyTransfer):
        """Restores, then flips one bit of the first restored block."""

        def h2d(self, tier, slots, engine, block_ids):  # type: ignore[no-untyped-def]
            super().h2d(tier, slots, engine, block_ids)
            if tier is not engine_tier[0]:
                return  # the scratch fill: leave it alone
            with engine.lock:
                (pool,) = engine.kv_pool()
                engine.set_kv_pool([pool.at[block_ids[0], 0, 0, 0, 0, 0].add(1)])

    engine_tier: list[object] = [None]
    real_stack_build = bench._Stack.build

    def build(*args, **kwargs):  # type: ignore[no-untyped-def]
        stack = real_stack_build(*args, **kwargs)
        engine_tier[0] = stack.dram
        return stack

    monkeypatch.setattr(bench, "HostCopyTransfer", Corrupting)
    monkeypatch.setattr(bench._Stack, "build", build)
    console, out, progress = _consoles()
    code = bench.run_transfer_bench(
        [1 * MiB], repeats=1, console=console, progress_console=progress
    )
    text = out.getvalue()
    assert code == 1, text
    assert "not bit-exact" in text and "after warm-up" in text


def test_first_mismatch_finds_a_single_flipped_bit() -> None:
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 1 << 16, size=(8, 2, 3, 4), dtype=np.uint16)
    block_ids = [5, 2, 7]
    expected = [pool[block_ids].copy()]
    assert bench.first_mismatch(expected, [pool], block_ids) is None
    corrupted = pool.copy()
    corrupted[7, 1, 2, 3] ^= 1 << 9
    why = bench.first_mismatch(expected, [corrupted], block_ids)
    assert why is not None and "pool block 7" in why and "1 bytes differ" in why
    assert bench.first_mismatch(expected, [pool], [5, 7, 2]) is not None  # wrong order
    assert bench.first_mismatch(expected, [pool, pool], block_ids) is not None


def test_nan_bit_patterns_are_compared_as_bits() -> None:
    pool = np.full((2, 4), np.nan, dtype=np.float32)
    expected = [pool.copy()]
    assert bench.first_mismatch(expected, [pool], [0, 1]) is None  # NaN == NaN bitwise
    pool.view(np.uint32)[1, 0] ^= 1  # another NaN payload: still NaN, different bits
    assert bench.first_mismatch(expected, [pool], [0, 1]) is not None


@pytest.mark.parametrize(("sizes", "repeats"), [([3 * 1024], 1), ([1 * MiB], 0), ([], 1), ([0], 1)])
def test_unmeasurable_arguments_exit_2(sizes: list[int], repeats: int) -> None:
    console, _, progress = _consoles()
    assert bench.run_transfer_bench(sizes, repeats, console=console, progress_console=progress) == 2


def test_block_size_divides_every_size() -> None:
    token = bench.TOKEN_BYTES
    assert bench._block_tokens([64 * MiB, 256 * MiB, 1 << 30]) == bench.MAX_BLOCK_TOKENS
    assert bench._block_tokens([3 * token, 64 * MiB]) == 1
    assert bench._block_tokens([48 * token]) == 16
