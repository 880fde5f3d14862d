"""The session core driven by an engine that runs the model itself (vLLM's connector).

==========  ===========================================================================
module      its one job
==========  ===========================================================================
plans       the plans, results and stored/removed events handed to the engine: values
host        the core's KV host for such an engine: only what it supports
lookup      what of a request's prefix a parked copy gives (and a promotion into a tier)
manager     prepare/complete store and load, expiry, stored/removed events, a new layout
pins        the record of vLLM's pins and of the pauses open since a turn end
turnends    a turn end's pin or drop, a pin's end, the pause closed at the next match
inhost      the engine's half of a plan done here, for a pool this process can reach
==========  ===========================================================================
"""

from __future__ import annotations

from collections.abc import Sequence

from agentpark.blocks import PoolGeometry
from agentpark.parking.core import CoreOptions, SessionCore
from agentpark.parking.external.anonymous import AnonymousPolicy
from agentpark.parking.external.host import ExternalHost
from agentpark.parking.external.inhost import park_turn, restore_prefix
from agentpark.parking.external.manager import ExternalManager
from agentpark.parking.external.plans import (
    BlocksRemoved,
    BlocksStored,
    KVEvent,
    LoadPlan,
    Pinned,
    Restored,
    StorePlan,
    TurnEndAsk,
    TurnEndChoice,
    TurnEndFacts,
    TurnEndRule,
)
from agentpark.parking.mover import ArrayPool, Mover
from agentpark.parking.recovery import recover
from agentpark.store.repository import SessionStore
from agentpark.tiers.base import HostTier

__all__ = [
    "BlocksRemoved",
    "BlocksStored",
    "ExternalHost",
    "ExternalManager",
    "KVEvent",
    "LoadPlan",
    "Pinned",
    "Restored",
    "StorePlan",
    "TurnEndAsk",
    "TurnEndChoice",
    "TurnEndFacts",
    "TurnEndRule",
    "external_core",
    "park_turn",
    "restore_prefix",
]


def external_core(
    store: SessionStore,
    geometry: PoolGeometry,
    model_uid: str,
    tiers: Sequence[HostTier],
    *,
    pool: ArrayPool | None = None,
    options: CoreOptions | None = None,
) -> ExternalManager:
    """A session core for an external engine, and its manager; the core is
    ``manager.core``. Sessions in SQLite are re-attached."""
    options = options or CoreOptions()
    host = ExternalHost(geometry, model_uid, pool)
    mover = Mover(
        geometry,
        tiers,
        None,
        options.checksum_tiers,
        key_algo=options.key_algo,
        key_seed=options.key_seed,
    )
    core = SessionCore(store, host, mover, options)
    host.sessions = core.registry.all
    anonymous = AnonymousPolicy(options.anonymous_share, options.anonymous_ttl_s)
    manager = ExternalManager(core, host, anonymous)
    recover(core)
    return manager
