"""The ``[kv_events]`` series: whether routers are told everything, read at scrape time.

A router that misses events routes to KV that is gone, or away from KV that is here; the
advertiser never blocks a park to send one, so what it could not queue is counted
(``dropped``) and made good by a full re-sync (``resyncs``). Exported only while
``[kv_events] endpoint`` is set (:data:`KV_EVENT_METRIC_NAMES`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agentpark.kvevents import MEDIUMS, KvEventFigures

__all__ = ["KV_EVENT_METRIC_NAMES", "KvEventsCollector"]

KV_EVENT_METRIC_NAMES = (
    "agentpark_kv_event_batches_total",
    "agentpark_kv_event_changes_dropped_total",
    "agentpark_kv_event_resyncs_total",
    "agentpark_kv_event_advertised_blocks",
)


class KvEventsCollector(Collector):
    """The advertiser's figures as Prometheus families, labelled with the host."""

    def __init__(self, figures: Callable[[], KvEventFigures], host: str) -> None:
        self.figures = figures
        self.host = host

    def describe(self) -> Iterable[Metric]:
        return self._families(None)

    def collect(self) -> Iterable[Metric]:
        return self._families(self.figures())

    def _families(self, view: KvEventFigures | None) -> list[Metric]:
        h = self.host
        batches = CounterMetricFamily(
            "agentpark_kv_event_batches",
            "KVEventBatch messages published on the [kv_events] endpoint.",
            labels=("host",),
        )
        dropped = CounterMetricFamily(
            "agentpark_kv_event_changes_dropped",
            "Block changes the full event queue refused; each leads to a full re-sync.",
            labels=("host",),
        )
        resyncs = CounterMetricFamily(
            "agentpark_kv_event_resyncs",
            "Full re-syncs (AllBlocksCleared, then every parked block): after dropped "
            "changes or a router (re)subscribing.",
            labels=("host",),
        )
        advertised = GaugeMetricFamily(
            "agentpark_kv_event_advertised_blocks",
            "Block hashes advertised to routers now, by medium (CPU: dram and shm; STORAGE: disk).",
            labels=("host", "medium"),
        )
        if view is not None:
            batches.add_metric([h], view.batches)
            dropped.add_metric([h], view.dropped)
            resyncs.add_metric([h], view.resyncs)
            for medium in sorted({*MEDIUMS.values(), *view.advertised}):
                advertised.add_metric([h, medium], view.advertised.get(medium, 0))
        return [batches, dropped, resyncs, advertised]
