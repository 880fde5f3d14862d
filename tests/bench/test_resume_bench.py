"""``agentpark bench resume`` runs end to end on a tiny model, re-prefills through a real
restart, cleans up its /dev/shm files and fails on a resume that is not bit-exact."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from agentpark.bench import resume as bench
from agentpark.dma.host_copy import HostCopyTransfer
from agentpark.engine.reference import ModelSpec

from .conftest import Consoles

TINY = ModelSpec()  # 2 layers, d_model 64: compiles in a second or two


def _run(consoles: Consoles, shm_parent: Path, contexts: list[int], repeats: int) -> int:
    return bench.run_resume_bench(
        contexts,
        repeats,
        model=TINY,
        shm_root=shm_parent,
        console=consoles.out,
        progress_console=consoles.progress,
    )


def test_tiny_resume_bench_prints_a_row_per_context(consoles: Consoles, shm_parent: Path) -> None:
    code = _run(consoles, shm_parent, [64, 100], repeats=2)
    text = consoles.text
    assert code == 0, text
    assert "resume dram ms" in text and "resume shm ms" in text and "re-prefill s" in text
    for context in ("64", "100"):
        rows = [line for line in text.splitlines() if re.match(rf"│\s*{context}\s*│", line)]
        assert len(rows) == 1, text
        row = rows[0]
        # pause/resume dram, pause/resume shm (ms), re-prefill (s): "median (min-max)".
        assert len(re.findall(r"\d+\.\d+ \(\d+\.\d+-\d+\.\d+\)", row)) == 5, row
        assert len(re.findall(r"\d+x \(\d+-\d+\)", row)) == 2, row  # the two speed-ups
        assert "yes" in row  # every dram and shm resume was bit-exact
        assert re.search(r"│\s*[0-2]/2\s*│\s*$", row), row  # re-prefills with the same bits
    assert "restarted" in text and "LOST" in text
    assert "no 4096-token context to judge" in text
    assert list(shm_parent.iterdir()) == []  # the shm tier files are gone


def test_a_resume_that_is_not_bit_exact_fails_the_bench(
    consoles: Consoles, shm_parent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Corrupting(HostCopyTransfer):
        """Restores, then flips one bit of the first restored block."""

        def h2d(self, tier, slots, engine, block_ids, digest=False):  # type: ignore[no-untyped-def]
            got = super().h2d(tier, slots, engine, block_ids, digest)
            with engine.lock:
                (pool,) = engine.kv_pool()
                engine.set_kv_pool([pool.at[block_ids[0], 0, 0, 0, 0, 0].add(1)])
            return got

    monkeypatch.setattr(bench, "HostCopyTransfer", Corrupting)
    code = _run(consoles, shm_parent, [64], repeats=1)
    text = consoles.text
    assert code == 1, text
    assert "not bit-exact" in text and "after warm-up" in text
    assert list(shm_parent.iterdir()) == []


def test_shm_files_are_removed_when_the_bench_fails(
    consoles: Consoles, shm_parent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Path] = []

    def boom(stack: Any, *args: Any) -> None:
        seen.extend(shm_parent.rglob("*"))
        raise RuntimeError("injected failure")

    monkeypatch.setattr(bench, "_bench_context", boom)
    with pytest.raises(RuntimeError, match="injected failure"):
        _run(consoles, shm_parent, [64], repeats=1)
    assert any(p.name == "shm-64.bin" for p in seen), seen
    assert list(shm_parent.iterdir()) == []


@pytest.mark.parametrize(("contexts", "repeats"), [([64], 0), ([], 1), ([1], 1)])
def test_unmeasurable_arguments_exit_2(
    contexts: list[int], repeats: int, consoles: Consoles, shm_parent: Path
) -> None:
    assert _run(consoles, shm_parent, contexts, repeats) == 2


def test_verdict_is_judged_at_4k() -> None:
    fast = bench.ContextResult(4096, recompute_s=[2.0, 3.0], resume_dram_s=[0.01, 0.01])
    fast.resume_shm_s = [0.02, 0.5]  # per repeat: 100x and 6x, median 53x
    assert "met (dram 250x, shm 53x)" in bench._verdict([fast])
    slow = bench.ContextResult(4096, recompute_s=[1.0], resume_dram_s=[0.01], resume_shm_s=[0.2])
    assert bench._verdict([slow]).endswith("MISSED: shm (5.0x)")
    other = bench.ContextResult(1024, recompute_s=[1.0], resume_dram_s=[1.0], resume_shm_s=[1.0])
    assert "no 4096-token context to judge" in bench._verdict([other])
