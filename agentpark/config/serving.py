"""The sections that serve vLLM and the routers in front of it: ``[vllm]`` (the connector's
daemon side, its pool and the turn-end rule) and ``[kv_events]`` (parked blocks as vLLM KV
events). Bounded like every section (agentpark.config.sections)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ByteSize, Field

from agentpark.config.sections import _Section


class VllmSettings(_Section):
    """Serve vLLM's agentpark connector instead of running the reference engine.

    The daemon then owns the host pool (a /dev/shm file sized ``pool_capacity``, laid out
    as the engine registers) and answers the connector on a unix socket.
    """

    enabled: bool = Field(False, description="serve vLLM connectors (no reference engine)")
    pool_capacity: ByteSize | None = Field(
        None,
        ge=1 << 20,
        le=2**50,
        description="host pool (shm file) size; default 4x the engine's KV cache as its worker "
        "registers it, at most half of MemAvailable, at least 64 MiB (agentpark.connectors."
        "sizing)",
    )
    pool_path: Path | None = Field(
        None, description="default vllm-pool in a private /dev/shm folder (<state_dir>/shm-dir)"
    )
    control_socket: Path | None = Field(None, description="default <state_dir>/control.sock (0600)")
    plan_timeout_s: float = Field(
        60.0, ge=1.0, le=3600.0, description="fail a copy the engine never reported after this"
    )
    anonymous_share: float = Field(
        0.25,
        ge=0.0,
        le=1.0,
        description="most of the host pool the turns of requests that name no session may "
        "hold (oldest dropped first); 0: never park them",
    )
    anonymous_ttl_s: float = Field(
        600.0, ge=1.0, le=604_800.0, description="drop such a turn's copy this long after it"
    )
    block_hash: Literal["sha256", "sha256_cbor"] = Field(
        "sha256", description="block keys' hash: vLLM's --prefix-caching-hash-algo"
    )
    none_hash_seed: str = Field(
        "vllm-none-hash",
        min_length=1,
        max_length=256,
        description="the block-hash chain's root seed: vLLM's (its PYTHONHASHSEED if it has one)",
    )
    # A turn end's answer (agentpark.policy.turn_end); the defaults are reasoned there.
    turn_end: Literal["adaptive", "park", "pin"] = Field(
        "adaptive",
        description="a turn end's answer: adaptive (pin a short pause, park a long one, drop "
        "what is cheaper to recompute), park (park or keep by break-even only, as before), "
        "pin (pin every turn for pin_ttl_s while room, drop the rest and never park; "
        "Continuum's rule)",
    )
    pin_ttl_s: float = Field(
        30.0,
        gt=0.0,
        le=3600.0,
        description="a pin's time-out in turn_end=pin; in adaptive the cap of expected "
        "pause x pin_margin, and the longest expected pause that is pinned",
    )
    pin_margin: float = Field(
        2.0, ge=1.0, le=100.0, description="adaptive: a pin's time-out = expected pause x this"
    )
    pin_share: float = Field(
        0.25,
        ge=0.0,
        le=1.0,
        description="most of vLLM's KV cache (its blocks) pins may hold together; 0: never pin",
    )


class KvEventsSettings(_Section):
    """Parked blocks as vLLM-format KV events on ZMQ (agentpark.kvevents; docs/routers.md).
    Named like vLLM's --kv-events-config; the endpoint is always bound."""

    endpoint: str = Field("", description='ZMQ PUB to bind, e.g. "tcp://127.0.0.1:5557"; "" = off')
    connect: bool = Field(False, description="connect the PUB to endpoint (llm-d binds the SUB)")
    replay_endpoint: str = Field("", description="ZMQ ROUTER a router catches up on; '' = none")
    topic: str = ""
    buffer_steps: int = Field(10_000, ge=1, le=10_000_000, description="batches kept for replay")
    hwm: int = Field(100_000, ge=1, le=10_000_000, description="ZMQ high-water mark of the PUB")
    max_queue_size: int = Field(100_000, ge=1, le=10_000_000, description="full: dropped, counted")
    tenant: str = Field("default", min_length=1, description="whose blocks are advertised")
    block_hashes: Literal["int", "bytes"] = Field(
        "int", description="as vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (1: int, its default)"
    )
