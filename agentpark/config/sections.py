"""The sections of the configuration: one frozen model per TOML table, each key bounded.

Every field names its allowed range (``ge``/``le``) so a bad value is refused at start with
the key, the value and the range (agentpark.config.loading); deploy/agentpark.example.toml
documents every key and tests/test_config.py checks that file against these models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ByteSize, ConfigDict, Field, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8470, ge=0, le=65535, description="0 picks a free port")
    keep_alive_s: int = Field(
        75,
        ge=1,
        le=3600,
        description="idle keep-alive of a client connection; above client pool idle times",
    )


class ModelSettings(_Section):
    """The reference engine's transformer; tiny by default so it runs anywhere."""

    d_model: int = Field(64, ge=8, le=16384)
    n_layers: int = Field(2, ge=1, le=256)
    n_heads: int = Field(4, ge=1, le=256)
    n_kv_heads: int = Field(2, ge=1, le=256)
    head_dim: int = Field(16, ge=2, le=1024)
    ffn_dim: int = Field(128, ge=1, le=65536)
    max_seq_len: int = Field(1024, ge=16, le=1_048_576)
    seed: int = Field(0, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSettings:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even (rotary embedding)")
        return self


class PoolSettings(_Section):
    """The paged KV pool in accelerator memory (host memory on the CPU backend)."""

    block_size: int = Field(16, ge=1, le=4096, description="tokens per KV block")
    num_blocks: int = Field(256, ge=1, le=16_777_216)


class DramTierSettings(_Section):
    capacity: ByteSize = Field(ByteSize(256 * 2**20), ge=0, le=2**50)


class ShmTierSettings(_Section):
    capacity: ByteSize = Field(ByteSize(256 * 2**20), ge=0, le=2**50, description="0 disables")
    path: Path | None = Field(
        None, description="default shm-tier in a private /dev/shm folder (<state_dir>/shm-dir)"
    )


class DiskTierSettings(_Section):
    capacity: ByteSize = Field(ByteSize(0), ge=0, le=2**56, description="0 disables")
    path: Path | None = Field(None, description="default <state_dir>/disk-tier.bin")


class TierSettings(_Section):
    dram: DramTierSettings = DramTierSettings()
    shm: ShmTierSettings = ShmTierSettings()
    disk: DiskTierSettings = DiskTierSettings()


class IntegritySettings(_Section):
    """Checksums of parked copies, verified on restore; off costs nothing, on costs a hash."""

    checksum: Literal["xxh3", "none"] = "xxh3"
    tiers: tuple[Literal["dram", "shm", "disk"], ...] = Field(
        ("shm", "disk"),
        description="tiers whose copies are checksummed (persistent ones can be corrupted)",
    )


def _default_demotion() -> dict[Literal["dram", "shm"], float]:
    return {"dram": 300.0, "shm": 3600.0}


class ToolPolicySettings(_Section):
    expected_pause_s: float = Field(..., ge=0.0, le=86_400.0, description="prior, until learned")


class PolicySettings(_Section):
    """When the daemon parks, where, and when it brings a session back (reloadable)."""

    enabled: bool = Field(True, description="run the policy loop")
    tick_s: float = Field(1.0, ge=0.01, le=3600.0, description="how often the loop looks")
    idle_pause_after_s: float = Field(
        30.0, ge=0.0, le=864_000.0, description="park a session untouched this long; 0: never"
    )
    min_pause_s: float = Field(
        2.0, ge=0.0, le=86_400.0, description="keep a pause expected shorter than this"
    )
    overhead_s: float = Field(
        0.002, ge=0.0, le=60.0, description="control-plane cost of a round trip"
    )
    demote_after_s: dict[Literal["dram", "shm"], float] = Field(
        default_factory=_default_demotion,
        description="move a parked session to the next tier after this long; absent: never",
    )
    hbm_high_watermark: float = Field(
        0.90, ge=0.0, le=1.0, description="above this pool use, park idle sessions (LRU first)"
    )
    prefetch_lead_s: float = Field(
        0.5, ge=0.0, le=3600.0, description="restore this long before the expected resume"
    )
    tool_quantile: float = Field(
        0.5, ge=0.0, le=1.0, description="learned pause per tool: this quantile of the window"
    )
    tool_window: int = Field(64, ge=1, le=100_000, description="observations kept per tool")
    parked_ttl_s: float = Field(
        3600.0,
        ge=0.0,
        le=31_536_000.0,
        description="drop a parked copy untouched this long (lost, recomputed on the next "
        "turn); 0: never. Default 1 h: an agent's tool pause (seconds to minutes) or a "
        "user's reply (minutes) comes well inside it, and past an hour recomputing the "
        "prefix costs less than holding its KV in host memory for a turn that may never "
        "come",
    )
    tools: dict[str, ToolPolicySettings] = Field(default_factory=dict)


class ShutdownSettings(_Section):
    """On SIGTERM (or `agentpark drain`): park every session to shm/disk, then exit."""

    drain: bool = True
    deadline_s: float = Field(30.0, ge=0.0, le=3600.0)


class DmaSettings(_Section):
    """How blocks move between the pool and host tiers (agentpark.dma.select_transfer).

    ``auto``: host_copy on JAX's CPU platform, jax_memkind on a GPU or TPU. ``tpu_sync`` needs
    the ``agentpark[tpu]`` extra (Python >= 3.12) on a TPU host, or ``tpu_sync_on_cpu``.
    """

    backend: Literal["auto", "host_copy", "jax_memkind", "tpu_sync"] = "auto"
    tpu_sync_on_cpu: bool = Field(
        False,
        description="allow tpu_sync on JAX's CPU platform (its wheel runs there; tests, bench)",
    )
    tpu_sync_shm: bool = Field(
        False,
        description="tpu_sync: keep TPU Sync's host blocks in its /dev/shm segments (0600, "
        "layout-checked) so parked sessions survive a kill -9",
    )
    copy_threads: int = Field(
        1,
        ge=1,
        le=64,
        description="host_copy: threads one pause or restore copies and hashes with",
    )
    hash_thread: bool = Field(
        False,
        description="host_copy: hash a whole copy's checksum on one more thread while it runs "
        "(bench transfer, restores of copies parked before keys; parks digest each new block "
        "once it landed); needs a free core",
    )
    native_copy: bool = Field(
        True,
        description="host_copy: copy and hash in one pass with the native kernel where it is "
        "built (agentpark.dma.native); numpy and xxhash otherwise, and with hash_thread",
    )


class LimitSettings(_Section):
    max_new_tokens: int = Field(512, ge=1, le=1_048_576)
    max_body_bytes: int = Field(
        1_048_576, ge=1024, le=1_073_741_824, description="largest request body; more is 413"
    )
    max_metadata_bytes: int = Field(
        65_536, ge=0, le=1_073_741_824, description="largest session metadata (JSON); 413"
    )
    admission_timeout_s: float = Field(
        30.0,
        ge=0.0,
        le=3600.0,
        description="a generate or resume waits this long in the queue for pool blocks; 507",
    )
    background_yield_s: float = Field(
        30.0,
        ge=0.0,
        le=3600.0,
        description="a request waits this long for the daemon's own work on its session",
    )
    max_streams: int = Field(
        64, ge=1, le=100_000, description="event streams open at once, all tenants; 429"
    )
    max_streams_per_tenant: int = Field(
        8, ge=1, le=100_000, description="event streams one tenant may hold open; 429"
    )
    stream_queue_events: int = Field(
        1024, ge=1, le=1_000_000, description="events one stream may fall behind; then dropped"
    )
    stream_keepalive_s: float = Field(
        15.0, gt=0.0, le=3600.0, description="an idle event stream sends a comment this often"
    )


class MoveSettings(_Section):
    """Moves between daemons (agentpark.moving.dataport): the TCP data port a target takes
    a move's blocks on, off the HTTP body path, and how many sessions a drain hands over
    per begin and commit."""

    data: Literal["auto", "on", "off"] = Field(
        "auto",
        description="the data port: auto = on when server.host is a loopback address (the "
        "blocks go unencrypted, like the REST API itself; a non-loopback API may sit behind "
        "TLS the data port would bypass), on, off (blocks go in HTTP chunks)",
    )
    data_port: int = Field(0, ge=0, le=65535, description="0 picks a free port (advertised)")
    data_connections: int = Field(
        4, ge=1, le=256, description="data connections served at once; more are closed"
    )
    data_idle_s: float = Field(
        10.0, gt=0.0, le=3600.0, description="a data connection idle this long is cut"
    )
    ticket_ttl_s: float = Field(
        30.0, gt=0.0, le=3600.0, description="a data ticket unused this long is void"
    )
    batch_sessions: int = Field(
        32, ge=1, le=64, description="sessions a drain moves per begin and commit"
    )


class AuthSettings(_Section):
    """Failed authentications per peer (agentpark.api.auth_limit): past the burst, 429."""

    failure_burst: int = Field(
        50, ge=1, le=1_000_000, description="401s a peer may get at once before 429s"
    )
    failure_rate_per_s: float = Field(
        5.0, gt=0.0, le=1_000_000.0, description="401s per second a peer may get after that"
    )
    max_peers: int = Field(
        10_000, ge=1, le=10_000_000, description="peers tracked; the oldest is forgotten"
    )


class ReliabilitySettings(_Section):
    """What the daemon does about its own storage: the database and the tier files."""

    tier_files: Literal["refuse", "adopt", "discard"] = Field(
        "refuse",
        description="tier files with parked data but a database that knows no session: "
        "refuse to start, adopt them (keep the files, every slot free) or discard them",
    )
    storage_probe_s: float = Field(
        1.0, ge=0.05, le=3600.0, description="while writes fail, try one this often"
    )


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
