"""What every policy's daemon in ``agentpark bench agents`` shares (model, pool, tier
sizes, directories), each policy's daemon settings, and compiling the model once."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from agentpark.bench.agents.workload import (
    ADAPTIVE,
    PARKING_POLICIES,
    AgentPlan,
    WorkloadSpec,
    make_workload,
)
from agentpark.config import ModelSettings, PolicySettings, Settings
from agentpark.engine.reference import PREFILL_BUCKETS, ModelSpec, PoolSpec, ReferenceEngine

__all__ = ["BENCH_MODEL", "Setup", "adaptive_policy", "daemon_settings", "make_setup", "prewarm"]

BENCH_MODEL = ModelSettings(
    d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=32, ffn_dim=1024, max_seq_len=1024
)
"""The reference model of the bench: KV of 2 KiB per token; on this 2-core CPU a 256-token
prefill chunk takes ~0.1 s and a decode step ~3 ms. ``max_seq_len`` is replaced by the
workload's longest context (rounded up), since every step attends over ``max_seq_len`` keys."""


def adaptive_policy(spec: WorkloadSpec) -> PolicySettings:
    """agentpark's default policy with every duration scaled like the workload's."""
    base = PolicySettings()
    s = spec.time_scale
    return PolicySettings(
        enabled=True,
        tick_s=max(0.01, base.tick_s * s),
        idle_pause_after_s=base.idle_pause_after_s * s,
        min_pause_s=base.min_pause_s * s,
        overhead_s=base.overhead_s,  # a real cost of this host, not a workload time
        demote_after_s={tier: after * s for tier, after in base.demote_after_s.items()},
        hbm_high_watermark=base.hbm_high_watermark,
        prefetch_lead_s=base.prefetch_lead_s * s,
        tool_quantile=base.tool_quantile,
        tool_window=base.tool_window,
        tools={t.name: {"expected_pause_s": t.median_s * s} for t in spec.tools},
    )


@dataclass(frozen=True)
class Setup:
    """What every policy's daemon shares: the model, the pool, the tier sizes, the dirs."""

    spec: WorkloadSpec
    plans: list[AgentPlan]
    model: ModelSettings
    block_size: int
    pool_blocks: int
    tier_bytes: int
    root: Path
    shm_root: Path
    timeout_s: float
    sample_s: float

    @property
    def token_bytes(self) -> int:
        m = self.model
        return m.n_layers * 2 * m.n_kv_heads * m.head_dim * 2  # bfloat16 K and V

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.token_bytes

    def final_blocks(self, plan: AgentPlan) -> int:
        return -(-plan.final_tokens // self.block_size)


def make_setup(
    spec: WorkloadSpec,
    model: ModelSettings,
    block_size: int,
    root: Path,
    shm_root: Path,
    timeout_s: float,
    sample_s: float,
) -> Setup:
    plans = make_workload(spec)
    # Every step attends over max_seq_len keys: no longer than the workload needs.
    longest = max(p.final_tokens for p in plans)
    model = model.model_copy(update={"max_seq_len": max(64, -(-longest // 64) * 64)})
    final = [-(-p.final_tokens // block_size) for p in plans]
    pool_blocks = max(math.ceil(sum(final) / spec.pool_ratio), max(final) + 1)
    token_bytes = model.n_layers * 2 * model.n_kv_heads * model.head_dim * 2
    # Room in dram for every agent's whole KV, with a margin (and half that in shm).
    tier_bytes = (sum(final) * 5 // 4 + 8) * block_size * token_bytes
    return Setup(
        spec, plans, model, block_size, pool_blocks, tier_bytes, root, shm_root, timeout_s, sample_s
    )


def daemon_settings(policy: str, setup: Setup) -> Settings:
    parks = policy in PARKING_POLICIES
    if policy == ADAPTIVE:
        policy_settings = adaptive_policy(setup.spec)
    else:  # no loop: no idle, watermark or prefetch actions
        policy_settings = PolicySettings(enabled=False, idle_pause_after_s=0)
    dram = setup.tier_bytes if parks else 0
    state_dir = setup.root / policy
    return Settings(
        state_dir=state_dir,
        log_level="warning",
        server={"host": "127.0.0.1", "port": 0},
        model=setup.model,
        pool={"block_size": setup.block_size, "num_blocks": setup.pool_blocks},
        tiers={
            "dram": {"capacity": dram},
            "shm": {"capacity": dram // 2, "path": setup.shm_root / f"{policy}.tier"},
            "disk": {"capacity": 0},
        },
        limits={"max_new_tokens": max(16, setup.spec.new_tokens)},
        shutdown={"drain": False, "deadline_s": 5.0},
        policy=policy_settings,
    )


def prewarm(setup: Setup) -> None:
    """Compile every step shape the runs use, once (the daemons share JAX's cache)."""
    spec = ModelSpec(**setup.model.model_dump())
    engine = ReferenceEngine(spec, PoolSpec(setup.block_size, setup.pool_blocks))
    engine.warmup()
    for bucket in PREFILL_BUCKETS:
        blocks = engine.blocks_for(bucket)
        if bucket > spec.max_seq_len or blocks > setup.pool_blocks:
            break
        table = engine.allocator.allocate(("bench", f"warm-{bucket}"), blocks)
        engine.extend(table, 0, [0] * bucket)
        engine.allocator.free(("bench", f"warm-{bucket}"), table)
