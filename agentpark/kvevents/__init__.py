"""KV events for parked blocks, in vLLM's format on vLLM's transport (docs/routers.md).

``start(settings, core)`` (the runtime calls it when ``[kv_events] endpoint`` is set):
an :class:`~agentpark.kvevents.advertiser.Advertiser` listening on every tier of the
session core, publishing on ZMQ. Modules: ``wire`` (vLLM's structures, encoded without
vLLM), ``publisher`` (the PUB and replay sockets), ``advertiser`` (transitions -> events).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator

from agentpark.config.serving import KvEventsSettings
from agentpark.kvevents.advertiser import MEDIUMS, Advertiser, KvEventFigures, Source, medium_of
from agentpark.parking.core import SessionCore

__all__ = ["MEDIUMS", "Advertiser", "KvEventFigures", "Source", "medium_of", "start"]


def start(settings: KvEventsSettings, core: SessionCore) -> Advertiser:
    """Publish the events of ``core``'s tiers from now on (ZMQError: endpoint refused)."""

    def source(owner: Hashable) -> Source | None:
        live = core.registry.find(owner)  # type: ignore[arg-type]
        if live is None:
            return None
        return Source(list(live.tokens), live.cache_salt, live.lora)

    def parked() -> Iterator[tuple[Hashable, str, list[Hashable | None]]]:
        for live in core.registry.all():
            if live.row.tier and live.keys:
                yield live.key, live.row.tier, list(live.keys)

    advertiser = Advertiser(
        settings, lambda: core.mover.tiers, lambda: core.mover.hasher, source, parked
    )
    core.mover.on_relayout.append(advertiser.relayout)
    advertiser.start()
    return advertiser
