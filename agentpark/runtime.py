"""Wires one daemon together: database, engine, DMA backend, tiers and parking."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from agentpark.config import Settings
from agentpark.dma import select_transfer
from agentpark.engine.reference import ModelSpec, PoolSpec, ReferenceEngine
from agentpark.parking import Parking
from agentpark.store.db import open_database
from agentpark.store.migrate import upgrade
from agentpark.store.repository import SessionStore
from agentpark.tiers.dram import DramTier

__all__ = ["Runtime"]

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    settings: Settings
    store: SessionStore
    engine: ReferenceEngine
    parking: Parking
    ready: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(cls, settings: Settings) -> Runtime:
        """Migrate the database, build every part, re-attach sessions from SQLite."""
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        upgrade(settings.database_url)
        store = SessionStore(*open_database(settings.database_url))
        engine = ReferenceEngine(
            ModelSpec(**settings.model.model_dump()), PoolSpec(**settings.pool.model_dump())
        )
        transfer = select_transfer(settings.dma.backend)
        dram = DramTier(engine.geometry, int(settings.tiers.dram.capacity))
        parking = Parking(store, engine, transfer, dram, settings.limits.max_new_tokens)
        log.info(
            "pool: %d blocks of %d bytes (%d tokens each); dram tier: %d blocks; dma: %s",
            engine.geometry.num_blocks,
            engine.geometry.block_nbytes,
            engine.geometry.block_size,
            dram.capacity_blocks,
            transfer.name,
        )
        return cls(settings, store, engine, parking)

    def warm_up(self) -> None:
        """Compile the engine's common shapes, then report ready (/readyz)."""
        try:
            self.engine.warmup()
        except Exception:
            log.exception("engine warm-up failed; the daemon stays not ready")
            return
        self.ready.set()
        log.info("engine warm; ready")

    def close(self) -> None:
        self.store.close()
