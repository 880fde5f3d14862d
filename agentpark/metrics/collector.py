"""The host collector: gauges read from the host snapshot and the live sessions at scrape time.

Read at each scrape, so a gauge is never stale and costs nothing between scrapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from agentpark import __version__
from agentpark.connectors.protocol import UNPIN_CAUSES
from agentpark.enums import State
from agentpark.snapshot import HostSnapshot, PinFigures
from agentpark.store.models import SessionRow


class HostCollector(Collector):
    """Gauges read from the host view at scrape time."""

    def __init__(
        self,
        snapshot: Callable[[], HostSnapshot],
        sessions: Callable[[], list[SessionRow]],
        host: str,
    ) -> None:
        self.snapshot = snapshot
        self.sessions = sessions
        self.host = host

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        return list(self._families(self.snapshot()))

    def _families(self, view: HostSnapshot | None = None) -> Iterator[Metric]:
        h = self.host
        info = InfoMetricFamily(
            "agentpark_build",
            "The daemon's version, DMA backend and model.",
            labels=("host", "version", "dma_backend", "model_uid"),
        )
        ready = GaugeMetricFamily(
            "agentpark_ready",
            "1 when the engine is warm and sessions are served.",
            labels=("host",),
        )
        pool_blocks = GaugeMetricFamily(
            "agentpark_pool_blocks", "KV pool blocks by state.", labels=("host", "state")
        )
        pool_bytes = GaugeMetricFamily(
            "agentpark_pool_bytes", "KV pool (HBM) bytes by state.", labels=("host", "state")
        )
        block_bytes = GaugeMetricFamily(
            "agentpark_pool_block_bytes", "Bytes of one KV block.", labels=("host",)
        )
        reclaimed = GaugeMetricFamily(
            "agentpark_hbm_reclaimed_bytes",
            "HBM given back to the pool by parking: KV bytes of the sessions parked now.",
            labels=("host",),
        )
        parked = GaugeMetricFamily(
            "agentpark_parked_bytes",
            "KV bytes of the sessions parked now, by tier.",
            labels=("host", "tier"),
        )
        tier_gauges = {
            key: GaugeMetricFamily(
                f"agentpark_tier_{key}", f"Tier {key.replace('_', ' ')}.", labels=("host", "tier")
            )
            for key in ("capacity_bytes", "used_bytes", "capacity_blocks", "used_blocks")
        }
        sessions = GaugeMetricFamily(
            "agentpark_sessions", "Live sessions by state.", labels=("host", "state")
        )
        avoided = CounterMetricFamily(
            "agentpark_prefill_tokens_avoided",
            "Prompt tokens an engine did not recompute: restored from a parked copy (by=park) "
            "or served by vLLM's prefix cache from pinned blocks (by=pin).",
            labels=("host", "by"),
        )
        kept = CounterMetricFamily(
            "agentpark_kv_bytes_kept",
            "KV bytes a session's next turn got back without a recompute: whole blocks of the "
            "tokens restored from a parked copy (by=park) or reused from a pin (by=pin).",
            labels=("host", "by"),
        )
        pinned = GaugeMetricFamily(
            "agentpark_pinned_sessions", "vLLM sessions pinned now.", labels=("host",)
        )
        pinned_blocks = GaugeMetricFamily(
            "agentpark_pinned_blocks", "vLLM KV blocks pinned sessions hold now.", labels=("host",)
        )
        released = CounterMetricFamily(
            "agentpark_pins_released",
            "vLLM pins ended, by cause (return, timeout, pressure, shutdown, restart, expired).",
            labels=("host", "cause"),
        )
        if view is not None:
            info.add_metric([h, __version__, view.dma_backend, view.model_uid], {})
            ready.add_metric([h], 1.0 if view.ready else 0.0)
            pool = view.pool
            pool_blocks.add_metric([h, "free"], pool.free_blocks)
            pool_blocks.add_metric([h, "used"], pool.used_blocks)
            pool_bytes.add_metric([h, "free"], pool.free_bytes)
            pool_bytes.add_metric([h, "used"], pool.used_bytes)
            block_bytes.add_metric([h], pool.block_bytes)
            reclaimed.add_metric([h], view.reclaimed_bytes)
            by_tier = dict.fromkeys(view.tiers, 0)
            for row in self.sessions():
                if row.state == State.PARKED and row.tier:
                    by_tier[row.tier] = by_tier.get(row.tier, 0) + row.kv_bytes
            for tier, nbytes in sorted(by_tier.items()):
                parked.add_metric([h, tier], nbytes)
            for name, figures in sorted(view.tiers.items()):
                for key, family in tier_gauges.items():
                    family.add_metric([h, name], getattr(figures, key))
            for state, count in sorted(view.sessions.items()):
                sessions.add_metric([h, state], count)
            pins = view.pins or PinFigures()
            by_park = max(0, view.counters.prefill_tokens_avoided - pins.tokens_saved)
            avoided.add_metric([h, "park"], by_park)
            avoided.add_metric([h, "pin"], pins.tokens_saved)
            kept.add_metric([h, "park"], by_park // pool.block_size_tokens * pool.block_bytes)
            kept.add_metric([h, "pin"], pins.bytes_saved)
            pinned.add_metric([h], pins.sessions)
            pinned_blocks.add_metric([h], pins.blocks)
            for cause in sorted({*UNPIN_CAUSES, "expired", *pins.released}):
                released.add_metric([h, cause], pins.released.get(cause, 0))
        yield info
        yield ready
        yield pool_blocks
        yield pool_bytes
        yield block_bytes
        yield reclaimed
        yield parked
        yield from tier_gauges.values()
        yield sessions
        yield avoided
        yield kept
        yield pinned
        yield pinned_blocks
        yield released
