"""``agentpark bench resume``: resume from a tier against re-prefill from the token log.

For each context length a session is built for real: :meth:`InProcessDriver.generate` prefills
``context - 1`` random prompt tokens (in the reference engine's 256-token chunks) and decodes
one, so it holds ``context`` tokens of KV. Then, ``repeats`` times, interleaved:

* pause to dram, then :meth:`SessionCore.resume` (timed): the copy back from the dram tier;
* pause to shm, then resume (timed): the same from the /dev/shm file, checksum verified
  (the daemon's default ``integrity.tiers`` checksums shm and disk);
* pause to dram, then a daemon restart (a new session core over the same SQLite store;
  the dram copy died with the old process, so the session comes back LOST), then resume
  (timed): what a lost session costs, a re-prefill of the whole token log.

All three are timed end to end around ``SessionCore.resume`` (block allocation, copy or compute,
SQLite writes). The speed-up of a repeat is its re-prefill time over its resume time.

Each context gets an engine whose ``max_seq_len`` is the context itself: the reference engine
attends over ``max_seq_len`` keys in every chunk, so a larger limit would only make the
re-prefill (and the speed-up) look better. Every step shape and restore window is compiled
before anything is timed. After every dram and shm resume the session's pool rows are compared
bit for bit with the KV it had before the pause; a difference makes the bench exit 1. Whether
the re-prefill reproduced the same bits is reported too (it runs the log in different chunks
than the original prompt + decode, so it need not).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np
from rich.console import Console
from rich.table import Table

from agentpark.bench.common import (
    BENCH_TENANT,
    human,
    park,
    pool_mismatch,
    progress_bar,
    restore,
    snapshot_blocks,
    spread,
    stdout_console,
    timed,
)
from agentpark.dma.host_copy import HostCopyTransfer
from agentpark.engine.reference import PREFILL_BUCKETS, ModelSpec, PoolSpec, ReferenceEngine
from agentpark.enums import State
from agentpark.parking import CoreOptions, InProcessDriver, SessionCore, in_process_core
from agentpark.store.db import open_database
from agentpark.store.migrate import upgrade
from agentpark.store.repository import SessionStore
from agentpark.tiers.dram import DramTier
from agentpark.tiers.shm import ShmTier

__all__ = ["RESUME_MODEL", "SHM_ROOT", "ContextResult", "run_resume_bench"]

RESUME_MODEL = ModelSpec(
    d_model=512, n_layers=4, n_heads=8, n_kv_heads=8, head_dim=64, ffn_dim=2048
)
"""Large enough that prefill costs what it does in real models: attention over the context
dominates at 4k tokens and up (8 KiB of bf16 KV per token)."""
BLOCK_TOKENS = 64
TARGET_SPEEDUP = 10.0
TARGET_CONTEXT = 4096
TENANT = BENCH_TENANT
SEED = 20240612
SHM_ROOT = Path("/dev/shm")


@dataclass
class ContextResult:
    """What one context length measured; times in seconds, one entry per repeat."""

    context: int
    kv_bytes: int = 0
    prefill_s: float = 0.0  # the generate() that built the session (prompt + 1 decode)
    pause_dram_s: list[float] = field(default_factory=list)
    resume_dram_s: list[float] = field(default_factory=list)
    pause_shm_s: list[float] = field(default_factory=list)
    resume_shm_s: list[float] = field(default_factory=list)
    recompute_s: list[float] = field(default_factory=list)
    recompute_same_bits: list[bool] = field(default_factory=list)
    mismatch: str | None = None  # a dram/shm resume that was not bit-exact

    @property
    def exact(self) -> bool:
        return self.mismatch is None

    @property
    def speedup_dram(self) -> list[float]:
        """Per repeat: re-prefill time over the dram resume time."""
        return [r / d for r, d in zip(self.recompute_s, self.resume_dram_s, strict=True)]

    @property
    def speedup_shm(self) -> list[float]:
        """Per repeat: re-prefill time over the shm resume time."""
        return [r / s for r, s in zip(self.recompute_s, self.resume_shm_s, strict=True)]


class _ContextStack:
    """One daemon's parts for one context length: engine, dram and shm tiers, parking."""

    def __init__(self, store: SessionStore, context: int, model: ModelSpec, shm_dir: Path) -> None:
        blocks = -(-context // BLOCK_TOKENS)
        spec = dataclasses.replace(model, max_seq_len=context)
        # Room for the session twice over: a resume lands on other blocks than it left.
        self.engine = ReferenceEngine(
            spec, PoolSpec(block_size=BLOCK_TOKENS, num_blocks=2 * blocks + 4)
        )
        self.store = store
        capacity = blocks * self.engine.geometry.block_nbytes
        self.dram = DramTier(self.engine.geometry, capacity)
        try:
            self.shm = ShmTier(
                shm_dir / f"shm-{context}.bin",
                self.engine.geometry,
                capacity,
                self.engine.model_uid,
            )
        except BaseException:
            self.dram.close()
            raise
        self.transfer = HostCopyTransfer()
        self.driver = self._start()

    def _start(self) -> InProcessDriver:
        return in_process_core(
            self.store,
            self.engine,
            self.transfer,
            self.tiers,
            max_new_tokens=1,
            options=CoreOptions(),
        )

    @property
    def parking(self) -> SessionCore:
        return self.driver.core

    @property
    def tiers(self) -> list[DramTier | ShmTier]:
        return [self.dram, self.shm]

    def compile(self) -> None:
        """Every step shape (prefill buckets, decode) and every restore window, untimed."""
        engine = self.engine
        engine.warmup()
        for tier in self.tiers:
            self.transfer.warmup(engine, tier)
        key = ("bench", "compile")
        for bucket in PREFILL_BUCKETS:
            if bucket > engine.max_seq_len:
                break
            blocks = engine.allocator.allocate(key, engine.blocks_for(bucket))
            try:
                engine.extend(blocks, 0, [0] * bucket)
            finally:
                engine.allocator.free(key, blocks)

    def restart(self, session_id: str) -> None:
        """What a daemon restart does: process memory (the dram tier) is gone, and a new
        session core re-attaches the sessions from SQLite, so one parked in dram becomes LOST."""
        self.parking.close()
        self.dram.free((TENANT, session_id))
        self.driver = self._start()

    def close(self) -> None:
        self.parking.close()
        for tier in self.tiers:
            tier.close()


def run_resume_bench(
    contexts: list[int],
    repeats: int,
    *,
    model: ModelSpec | None = None,
    shm_root: Path | None = None,
    console: Console | None = None,
    progress_console: Console | None = None,
) -> int:
    """Measure, print the table (to ``console``, stdout by default); 1 if a resume differs.

    ``model`` defaults to :data:`RESUME_MODEL`. The shm tier files go in a temporary
    directory under ``shm_root`` (default :data:`SHM_ROOT`), removed at the end (also on
    error). Returns 2 for contexts shorter than 2 tokens or ``repeats < 1``.
    """
    model = model if model is not None else RESUME_MODEL
    shm_root = shm_root if shm_root is not None else SHM_ROOT
    out = console if console is not None else stdout_console(170)
    err = progress_console if progress_console is not None else Console(stderr=True)
    if repeats < 1:
        err.print(f"agentpark: --repeats must be >= 1, got {repeats}")
        return 2
    if not contexts or min(contexts) < 2:
        err.print(f"agentpark: each context must be at least 2 tokens, got {contexts}")
        return 2
    results: list[ContextResult] = []
    with contextlib.ExitStack() as cleanup:
        state_dir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="agentpark-")))
        shm_dir = Path(
            cleanup.enter_context(
                tempfile.TemporaryDirectory(prefix="agentpark-bench-", dir=shm_root)
            )
        )
        url = f"sqlite:///{state_dir / 'agentpark.db'}"
        upgrade(url)
        store = SessionStore(*open_database(url))
        cleanup.callback(store.close)
        with progress_bar(err) as progress:
            task = progress.add_task("resume bench", total=len(contexts) * (2 + 3 * repeats))
            for i, context in enumerate(contexts):

                def step(what: str, context: int = context) -> None:
                    progress.update(task, advance=1, description=f"{context} tokens: {what}")

                stack = _ContextStack(store, context, model, shm_dir)
                try:
                    results.append(_bench_context(stack, context, repeats, SEED + i, step))
                finally:
                    stack.close()
                    del stack
                    gc.collect()
    out.print(_table(results))
    for note in _notes(model, repeats, results):
        out.print(note, soft_wrap=True, highlight=False)
    failed = [r for r in results if not r.exact]
    for r in failed:
        out.print(f"[red]FAIL[/red] {r.context} tokens: resumed KV is not bit-exact: {r.mismatch}")
    out.print(_verdict(results), soft_wrap=True, highlight=False)
    return 1 if failed else 0


# ---- one context -------------------------------------------------------------------------


def _bench_context(
    stack: _ContextStack, context: int, repeats: int, seed: int, step: Callable[[str], None]
) -> ContextResult:
    result = ContextResult(context)
    session_id = f"ctx-{context}"
    key = (TENANT, session_id)
    rng = np.random.default_rng(seed)
    stack.compile()
    step("compiled")
    stack.parking.create(TENANT, session_id, {"bench": "resume", "context": context})
    try:
        prompt = rng.integers(0, stack.engine.vocab_size, context - 1).tolist()
        result.prefill_s = timed(stack.driver.generate, TENANT, session_id, prompt, 1)
        result.kv_bytes = stack.parking.get(TENANT, session_id).kv_bytes
        # What generate() built; the dram and shm resumes must give back exactly what the
        # pool held before their pause (this, or a re-prefill's bits if they differ).
        original = expected = snapshot_blocks(stack.engine, _owned(stack, key))
        # Warm-up, untimed: SQLite, the tiers' pages, one checksum of the shm copy.
        for tier in ("dram", "shm"):
            park(stack.parking, session_id, tier)
            restore(stack.parking, session_id, tier)
        result.mismatch = _check(stack, key, expected, "after warm-up")
        step("prefilled")
        for _ in range(repeats if result.exact else 0):
            for tier, pauses, resumes in (
                ("dram", result.pause_dram_s, result.resume_dram_s),
                ("shm", result.pause_shm_s, result.resume_shm_s),
            ):
                pauses.append(timed(park, stack.parking, session_id, tier))
                resumes.append(timed(restore, stack.parking, session_id, tier))
                result.mismatch = result.mismatch or _check(
                    stack, key, expected, f"after a resume from {tier}"
                )
                step(f"resume from {tier}")
            park(stack.parking, session_id, "dram")
            stack.restart(session_id)
            state = stack.parking.get(TENANT, session_id).state
            if state != State.LOST:
                raise RuntimeError(f"after the restart the session is {state}, not lost")
            result.recompute_s.append(timed(restore, stack.parking, session_id, "recompute"))
            same = _check(stack, key, original, "after the re-prefill") is None
            result.recompute_same_bits.append(same)
            expected = original if same else snapshot_blocks(stack.engine, _owned(stack, key))
            step("re-prefill")
    finally:
        stack.parking.delete(TENANT, session_id)
    return result


def _owned(stack: _ContextStack, key: tuple[str, str]) -> list[int]:
    return stack.engine.allocator.owned(key)


def _check(
    stack: _ContextStack, key: tuple[str, str], expected: Sequence[np.ndarray], when: str
) -> str | None:
    return pool_mismatch(stack.engine, expected, _owned(stack, key), when)


# ---- report ------------------------------------------------------------------------------


def _ms(values: Sequence[float]) -> str:
    return spread([v * 1e3 for v in values], ".1f")


def _table(results: Sequence[ContextResult]) -> Table:
    table = Table(title="agentpark bench resume: SessionCore.resume from a tier vs re-prefill")
    names = ["context", "KV", "pause dram ms", "resume dram ms", "pause shm ms"]
    names += ["resume shm ms", "re-prefill s", "speed-up dram", "speed-up shm"]
    for name in names:
        table.add_column(name, justify="right")
    table.add_column("bit-exact", justify="center")
    table.add_column("re-prefill exact", justify="center")
    for r in results:
        if not r.recompute_s:
            table.add_row(f"{r.context}", *["-"] * (len(names) - 1), "[red]NO[/red]", "-")
            continue
        target = r.context == TARGET_CONTEXT
        cells = [f"{r.context}", human(r.kv_bytes) if r.kv_bytes else "-"]
        cells += [_ms(r.pause_dram_s), _ms(r.resume_dram_s), _ms(r.pause_shm_s)]
        cells += [_ms(r.resume_shm_s), spread(r.recompute_s)]
        for speedups in (r.speedup_dram, r.speedup_shm):
            value = statistics.median(speedups)
            style = "red" if target and value < TARGET_SPEEDUP else "green"
            cells.append(
                f"[{style}]{value:.0f}x[/{style}] ({min(speedups):.0f}-{max(speedups):.0f})"
            )
        cells.append("[green]yes[/green]" if r.exact else "[red]NO[/red]")
        same = sum(r.recompute_same_bits)
        cells.append(f"{same}/{len(r.recompute_same_bits)}")
        table.add_row(*cells)
    return table


def _notes(model: ModelSpec, repeats: int, results: Sequence[ContextResult]) -> list[str]:
    built = ", ".join(f"{r.context} tokens {r.prefill_s:.2f} s" for r in results if r.prefill_s)
    return [
        f"median (min-max) of {repeats} repeats, interleaved; times around SessionCore.pause/"
        "resume (allocation, copy or compute, SQLite writes); speed-up = re-prefill time "
        "over resume time, per repeat.",
        f"model d_model {model.d_model}, {model.n_layers} layers, {model.n_heads} heads "
        f"({model.n_kv_heads} KV) x {model.head_dim}, ffn {model.ffn_dim}, bf16 KV, "
        f"blocks of {BLOCK_TOKENS} tokens, max_seq_len = the context; prefill in chunks of "
        f"{PREFILL_BUCKETS[-1]} tokens; jax {jax.__version__} ({jax.default_backend()}).",
        "re-prefill: the session is paused to dram and the daemon restarted (new session core on "
        "the same SQLite store): the dram copy is gone, the session is LOST, and its resume "
        "recomputes the KV from the token log. shm resumes include the checksum verify "
        "(integrity defaults); dram ones are not checksummed.",
        "bit-exact: every dram and shm resume gave back the KV the session had before its "
        "pause. re-prefill exact: re-prefills whose KV equals the original bit for bit; the "
        "re-prefill runs the whole log in 256-token chunks while generate() decoded the last "
        "token in a one-token step, so that token's K/V may round differently (the engine is "
        "bit-reproducible only for the same chunking).",
        f"the generate() that built each session (prompt + 1 decoded token, once): {built}.",
    ]


def _verdict(results: Sequence[ContextResult]) -> str:
    head = (
        f"target: resume >= {TARGET_SPEEDUP:.0f}x faster than re-prefill at "
        f"{TARGET_CONTEXT} tokens: "
    )
    judged = [r for r in results if r.context == TARGET_CONTEXT and r.recompute_s]
    if not judged:
        return head + f"no {TARGET_CONTEXT}-token context to judge"
    (r,) = judged
    got = {
        "dram": statistics.median(r.speedup_dram),
        "shm": statistics.median(r.speedup_shm),
    }
    misses = [f"{tier} ({value:.1f}x)" for tier, value in got.items() if value < TARGET_SPEEDUP]
    summary = ", ".join(f"{tier} {value:.0f}x" for tier, value in got.items())
    return head + (f"met ({summary})" if not misses else "MISSED: " + ", ".join(misses))
