"""Every Prometheus metric agentpark exports, defined once, served at ``/metrics``.

The modules behind this face: ``definitions`` (the families, their label sets and the
table of every series), ``observer`` (counts the session core's committed events) and
``collector`` (the gauges read from the host snapshot at scrape time) and ``kvevents``
(the ``[kv_events]`` publisher's series, while it is on).
"""

from agentpark.metrics.definitions import METRIC_NAMES, Metrics
from agentpark.metrics.kvevents import KV_EVENT_METRIC_NAMES, KvEventsCollector

__all__ = ["KV_EVENT_METRIC_NAMES", "METRIC_NAMES", "KvEventsCollector", "Metrics"]
