"""The metric families agentpark exports, defined once, served at ``/metrics``.

Two sources feed them:

- **events**: :meth:`Metrics.observe` is a listener of the session core's event log and sees every
  committed transition: counters (pauses by reason, resumes by source, bytes moved, restore
  failures, recompute fallbacks) and histograms (pause and resume latency, bandwidth).
- **the host view**: a collector reads the host snapshot and the live sessions at scrape
  time for the gauges (pool blocks, HBM reclaimed, parked bytes and use per tier, sessions
  by state), so a gauge is never stale and costs nothing between scrapes.

Label convention: every agentpark series carries ``host``, the daemon's
``dashboard.host_label`` (default: the machine's hostname), so series stay attributable
however Prometheus finds the target (a pod IP, a node port) and the Grafana dashboard and
the alert rules in ``deploy/`` group by it. ``instance`` and ``job`` are left to the scrape
config; the alert for a daemon that is down uses ``up{job="agentpark"}``, which Prometheus
itself records.

Each app has its own :class:`~prometheus_client.CollectorRegistry` (not the global one),
so several daemons in one process (the tests) never collide.

The metrics (``{...}`` are labels besides ``host``):

=========================================================  =========  =======================
name                                                        type       labels
=========================================================  =========  =======================
agentpark_build_info                                        gauge      version, dma_backend,
                                                                       model_uid
agentpark_ready                                             gauge
agentpark_pool_blocks                                       gauge      state (free, used)
agentpark_pool_bytes                                        gauge      state (free, used)
agentpark_pool_block_bytes                                  gauge
agentpark_hbm_reclaimed_bytes                               gauge
agentpark_parked_bytes                                      gauge      tier
agentpark_tier_capacity_bytes / _used_bytes                 gauge      tier
agentpark_tier_capacity_blocks / _used_blocks               gauge      tier
agentpark_sessions                                          gauge      state
agentpark_prefill_tokens_avoided_total                      counter    by (park, pin)
agentpark_kv_bytes_kept_total                               counter    by (park, pin)
agentpark_pinned_sessions                                   gauge
agentpark_pinned_blocks                                     gauge
agentpark_pins_released_total                               counter    cause
agentpark_events_total                                      counter    kind
agentpark_pauses_total                                      counter    reason, tier
agentpark_resumes_total                                     counter    source, reason
agentpark_recompute_fallbacks_total                         counter    reason
agentpark_restore_failures_total                            counter    tier
agentpark_sessions_lost_total                               counter    reason
agentpark_tier_moves_total                                  counter    kind, from_tier, to_tier
agentpark_transfer_bytes_total                              counter    direction, tier
agentpark_transfer_seconds_total                            counter    direction, tier
agentpark_transfer_bandwidth_bytes_per_second               histogram  direction, tier
agentpark_pause_duration_seconds                            histogram  tier
agentpark_resume_duration_seconds                           histogram  source
agentpark_vllm_degraded_total                               counter    cause
agentpark_auth_failures_total                               counter    answer
=========================================================  =========  =======================

plus the ``process_*`` series of this process. ``direction`` is ``park`` (pool to a tier;
``tier`` is where the bytes went), ``restore`` (a tier back to the pool; ``tier`` is where
they came from) or ``move`` (a copy from one tier to another, whatever its reason;
``tier`` is the destination). ``source`` is the tier a resume restored from, ``recompute``
when the parked copy was gone and the session was rebuilt by re-prefill, or ``pool`` for a
resume that found the session already in the pool (when parking records one).
``by`` says what saved a recompute: ``park`` (a copy loaded back from a host tier) or
``pin`` (vLLM's own prefix cache, from blocks a pin kept allocated; vLLM mode). ``cause``
is why a pin ended: ``return`` (the session's next request), ``timeout``, ``pressure``
(the pool needed the blocks), ``shutdown`` (vLLM stopped), ``restart`` (the daemon
forgot it) or ``expired`` (no word from the connector past its time-out).
``answer`` is what a failed authentication got: ``unauthenticated`` (401) or ``throttled``
(429, its peer over ``[auth]``'s limit; agentpark.api.auth_limit).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.exposition import choose_encoder

from agentpark.control.degraded import DegradedCause
from agentpark.enums import Reason
from agentpark.metrics.collector import HostCollector
from agentpark.metrics.observer import EventObserver
from agentpark.snapshot import HostSnapshot
from agentpark.store.models import EventRow, SessionRow

# Pause reasons and the label sets created at start (so rate() and increase() see a zero).
PAUSE_REASONS = (Reason.EXPLICIT, Reason.TURN_END, Reason.IDLE, Reason.PRESSURE, Reason.DRAIN)
# Latency: 100 us .. 60 s; bandwidth: 1 MB/s .. 1 TB/s.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
BANDWIDTH_BUCKETS = tuple(float(10**e) for e in range(6, 13)) + tuple(
    float(3 * 10**e) for e in range(6, 12)
)

# Every family name this module exports (tests check deploy/ against a live /metrics).
METRIC_NAMES = (
    "agentpark_build_info",
    "agentpark_ready",
    "agentpark_pool_blocks",
    "agentpark_pool_bytes",
    "agentpark_pool_block_bytes",
    "agentpark_hbm_reclaimed_bytes",
    "agentpark_parked_bytes",
    "agentpark_tier_capacity_bytes",
    "agentpark_tier_used_bytes",
    "agentpark_tier_capacity_blocks",
    "agentpark_tier_used_blocks",
    "agentpark_sessions",
    "agentpark_prefill_tokens_avoided_total",
    "agentpark_kv_bytes_kept_total",
    "agentpark_pinned_sessions",
    "agentpark_pinned_blocks",
    "agentpark_pins_released_total",
    "agentpark_events_total",
    "agentpark_pauses_total",
    "agentpark_resumes_total",
    "agentpark_recompute_fallbacks_total",
    "agentpark_restore_failures_total",
    "agentpark_sessions_lost_total",
    "agentpark_tier_moves_total",
    "agentpark_transfer_bytes_total",
    "agentpark_transfer_seconds_total",
    "agentpark_transfer_bandwidth_bytes_per_second",
    "agentpark_pause_duration_seconds",
    "agentpark_resume_duration_seconds",
    "agentpark_vllm_degraded_total",
    "agentpark_auth_failures_total",
)


class Metrics:
    """The metrics of one daemon: a registry, the event listener and the host collector."""

    def __init__(
        self,
        snapshot: Callable[[], HostSnapshot],
        sessions: Callable[[], list[SessionRow]],
        host: str,
    ) -> None:
        self.host = host
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        h = ("host",)
        self.events = Counter(
            "agentpark_events",
            "Session transitions committed, by kind.",
            (*h, "kind"),
            registry=reg,
        )
        self.pauses = Counter(
            "agentpark_pauses",
            "Sessions parked off the pool, by why (explicit, idle, pressure, drain) and tier.",
            (*h, "reason", "tier"),
            registry=reg,
        )
        self.resumes = Counter(
            "agentpark_resumes",
            "Sessions brought back into the pool, by source (a tier, recompute, pool) and "
            "by what asked (explicit, generate, prefetch).",
            (*h, "source", "reason"),
            registry=reg,
        )
        self.recomputes = Counter(
            "agentpark_recompute_fallbacks",
            "Resumes that rebuilt the KV by re-prefill because the parked copy was gone, by "
            "the resume's reason, or checksum when the copy was found corrupt.",
            (*h, "reason"),
            registry=reg,
        )
        self.restore_failures = Counter(
            "agentpark_restore_failures",
            "Restores from a tier that failed, by tier: a copy error (the parked copy is "
            "kept) or a checksum mismatch (the copy is dropped and the session recomputed).",
            (*h, "tier"),
            registry=reg,
        )
        self.lost = Counter(
            "agentpark_sessions_lost",
            "Sessions whose KV was found gone or corrupt, by reason (restart, checksum, "
            "drain; those of start-up are counted once the daemon is up).",
            (*h, "reason"),
            registry=reg,
        )
        self.moves = Counter(
            "agentpark_tier_moves",
            "Parked sessions moved between host tiers.",
            (*h, "kind", "from_tier", "to_tier"),
            registry=reg,
        )
        self.transfer_bytes = Counter(
            "agentpark_transfer_bytes",
            "KV bytes copied, by direction (park, restore, move) and tier.",
            (*h, "direction", "tier"),
            registry=reg,
        )
        self.transfer_seconds = Counter(
            "agentpark_transfer_seconds",
            "Seconds spent on those copies: rate(bytes) / rate(seconds) is the bandwidth.",
            (*h, "direction", "tier"),
            registry=reg,
        )
        self.bandwidth = Histogram(
            "agentpark_transfer_bandwidth_bytes_per_second",
            "Bandwidth of each copy (bytes / its duration).",
            (*h, "direction", "tier"),
            buckets=sorted(BANDWIDTH_BUCKETS),
            registry=reg,
        )
        self.pause_seconds = Histogram(
            "agentpark_pause_duration_seconds",
            "Pause latency: copy to the tier and bookkeeping, by tier.",
            (*h, "tier"),
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.resume_seconds = Histogram(
            "agentpark_resume_duration_seconds",
            "Resume latency: copy back or recompute, by source.",
            (*h, "source"),
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.degraded = Counter(
            "agentpark_vllm_degraded",
            "Requests a vLLM connector served as without agentpark (vLLM recomputed), by "
            "cause: a fixed set (daemon_unreachable, slow, bad_params, pool_full, "
            "session_busy, load_checksum, ...); any other is counted as 'other'",
            (*h, "cause"),
            registry=reg,
        )
        self.auth_failures = Counter(
            "agentpark_auth_failures",
            "Requests refused for a missing or invalid token, by answer: unauthenticated "
            "(401) or throttled (429: too many from one peer).",
            (*h, "answer"),
            registry=reg,
        )
        self._events = EventObserver(self, host)
        reg.register(HostCollector(snapshot, sessions, host))
        ProcessCollector(registry=reg)
        self._create_label_sets(list(snapshot().tiers))

    def _create_label_sets(self, tiers: Iterable[str]) -> None:
        """Create the series every host has, at zero, so they exist before the first event."""
        host = self.host
        self.recomputes.labels(host, Reason.EXPLICIT)
        self.recomputes.labels(host, Reason.CHECKSUM)
        self.lost.labels(host, Reason.RESTART)
        self.lost.labels(host, Reason.CHECKSUM)
        for tier in tiers:
            for reason in PAUSE_REASONS:
                self.pauses.labels(host, reason, tier)
            self.resumes.labels(host, tier, "explicit")
            self.restore_failures.labels(host, tier)
            self.pause_seconds.labels(host, tier)
            self.resume_seconds.labels(host, tier)
            for direction in ("park", "restore"):
                self.transfer_bytes.labels(host, direction, tier)
                self.transfer_seconds.labels(host, direction, tier)
                self.bandwidth.labels(host, direction, tier)
        self.resumes.labels(host, "recompute", "explicit")
        self.resume_seconds.labels(host, "recompute")
        self.degraded.labels(host, "daemon_unreachable")
        for answer in ("unauthenticated", "throttled"):
            self.auth_failures.labels(host, answer)

    def count_auth_failure(self, answer: str) -> None:
        """A request refused for its token (see agentpark.api.auth_limit)."""
        self.auth_failures.labels(self.host, answer).inc()

    def count_degraded(self, cause: str, n: int = 1) -> None:
        """A vLLM connector's request served without agentpark (see VllmService)."""
        self.degraded.labels(self.host, DegradedCause.of(cause).value).inc(n)

    # ---- events -------------------------------------------------------------------------

    def observe(self, event: EventRow) -> None:
        """The event listener: count one committed event (never raises)."""
        self._events.observe(event)

    # ---- exposition ---------------------------------------------------------------------

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """The exposition for this Accept header (Prometheus text, or OpenMetrics)."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
