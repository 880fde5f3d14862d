"""The history sections: what the host sampler keeps and shows, and how long rows live."""

from __future__ import annotations

from pydantic import Field, model_validator

from agentpark.config.sections import _Section


class DownsampleRule(_Section):
    """Samples older than ``after_h`` hours are merged into buckets of ``step_s`` seconds."""

    after_h: float = Field(ge=0.0, le=87_840.0)
    step_s: int = Field(ge=1, le=604_800)


class DashboardSettings(_Section):
    """Host history for /dashboard and /v1/host/history, peers, and the metrics' host label."""

    host_label: str | None = Field(
        None, min_length=1, max_length=128, description="default: the machine's hostname"
    )
    sample_interval_s: float = Field(10.0, ge=0.1, le=3600.0)
    retention_h: float = Field(168.0, ge=0.01, le=87_840.0)
    downsample: list[DownsampleRule] = Field(
        default_factory=lambda: [
            DownsampleRule(after_h=1.0, step_s=60),
            DownsampleRule(after_h=24.0, step_s=600),
        ],
        description="finest first; each step a multiple of the one before",
    )
    refresh_s: float = Field(5.0, ge=0.5, le=3600.0, description="the page reloads its data")
    peers: list[str] = Field(default_factory=list, description="other daemons' base URLs")
    peer_timeout_s: float = Field(1.0, ge=0.05, le=60.0)

    @model_validator(mode="after")
    def _consistent(self) -> DashboardSettings:
        previous: DownsampleRule | None = None
        for rule in self.downsample:
            if rule.step_s < self.sample_interval_s:
                raise ValueError(
                    f"downsample step_s ({rule.step_s}) is shorter than sample_interval_s "
                    f"({self.sample_interval_s})"
                )
            if rule.after_h >= self.retention_h:
                raise ValueError(
                    f"downsample after_h ({rule.after_h}) is not below retention_h "
                    f"({self.retention_h}): such samples are already deleted"
                )
            if previous is not None and not (
                rule.after_h > previous.after_h
                and rule.step_s > previous.step_s
                and rule.step_s % previous.step_s == 0
            ):
                raise ValueError(
                    "downsample rules must go from finest to coarsest: after_h and step_s "
                    "increasing, each step_s a multiple of the one before "
                    f"(got {previous.step_s}s after {previous.after_h}h, "
                    f"then {rule.step_s}s after {rule.after_h}h)"
                )
            previous = rule
        for peer in self.peers:
            scheme, sep, rest = peer.partition("://")
            if scheme not in ("http", "https") or not sep or not rest.strip("/"):
                raise ValueError(f"peer {peer!r} is not an http(s) URL like http://host-b:8470")
        return self


class RetentionSettings(_Section):
    """How long history is kept in SQLite; older rows are deleted in small batches.

    Host samples keep ``dashboard.retention_h``. Pruning runs with the sampler's upkeep
    (about once a minute), ``batch_rows`` rows per transaction, so no request waits long
    for SQLite's write lock.
    """

    events_h: float = Field(
        168.0, ge=0.01, le=87_840.0, description="events (other than tool returns), hours"
    )
    tool_returns_h: float = Field(
        168.0, ge=0.01, le=87_840.0, description="tool_return events (learned pauses), hours"
    )
    deleted_h: float = Field(
        168.0,
        ge=0.0,
        le=87_840.0,
        description="a deleted session's row, token log, logits and metadata, hours after "
        "the delete; then its id can be created again",
    )
    batch_rows: int = Field(5000, ge=1, le=1_000_000, description="rows per delete")
