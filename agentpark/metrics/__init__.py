"""Every Prometheus metric agentpark exports, defined once, served at ``/metrics``.

The modules behind this face: ``definitions`` (the families, their label sets and the
table of every series), ``observer`` (counts the session core's committed events) and
``collector`` (the gauges read from the host snapshot at scrape time).
"""

from agentpark.metrics.definitions import METRIC_NAMES, Metrics

__all__ = ["METRIC_NAMES", "Metrics"]
