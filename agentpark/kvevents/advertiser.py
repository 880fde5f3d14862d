"""Parked blocks as KV events: what a router may send here, and when it no longer may.

Each tier's SlotStore tells this, under its lock, when a key becomes findable (a park's
seal, a restart's claim) and when it stops being findable (freed, evicted from the cache,
forgotten as corrupt); :meth:`Advertiser.relayout` when tiers are replaced (a vLLM pool
registered with another layout). Those calls only enqueue, never block: a full queue drops
the item and counts it, and once the queue is empty again the thread re-syncs (an
``AllBlocksCleared``, then every parked copy again). It re-syncs too when a subscriber
joins, so a router that (re)starts learns what is parked already.

One thread turns the queue into ``KVEventBatch`` es (agentpark.kvevents.wire) and sends
them (agentpark.kvevents.publisher). Before a ``BlockStored`` it checks, at that moment,
that the key is still findable in its tier and that the hash chain of the owner's tokens
gives that very key (so ``token_ids`` and ``parent_block_hash`` are the block's own): a
block no load here would serve is never advertised. A hash is advertised once per
``medium`` (dram and shm are both "CPU") and removed once, when no tier of that medium
holds it any more.

Only one tenant's blocks are advertised (``[kv_events] tenant``): vLLM's events carry no
tenant, and a router sending tenant A's request here for tenant B's block would miss.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from agentpark.config.serving import KvEventsSettings
from agentpark.kvevents.publisher import ZmqPublisher
from agentpark.kvevents.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    encode_batch,
    external_hash,
)
from agentpark.kvkeys import BlockHasher, Lora
from agentpark.tiers.base import HostTier

__all__ = ["MEDIUMS", "Advertiser", "KvEventFigures", "Source", "medium_of"]

log = logging.getLogger(__name__)

# The ``medium`` of each host tier: vLLM's own names ("GPU", "CPU", "STORAGE"), the ones
# routers know. Dynamo 1.6.1 maps CPU to its host_pinned tier and STORAGE to disk, and
# drops an event whose medium it does not know (e.g. "CPU_SHM"): measured, docs/routers.md.
MEDIUMS = {"dram": "CPU", "shm": "CPU", "disk": "STORAGE"}
RESOLVE_S = 5.0  # how long a seal whose owner is not registered yet waits (start, import)

Event = BlockStored | BlockRemoved | AllBlocksCleared


def medium_of(tier_name: str) -> str:
    return MEDIUMS.get(tier_name, tier_name.upper())


@dataclass(frozen=True)
class Source:
    """What a block's key was computed from: its owner's tokens, salt and LoRA."""

    tokens: list[int]
    cache_salt: str | None
    lora: Lora | None


@dataclass
class _Stored:
    tier: str
    owner: Hashable
    blocks: list[tuple[int, Hashable]]
    until: float = 0.0


@dataclass
class _Removed:
    tier: str
    keys: list[Hashable]


class _Listener:
    """One tier's SlotListener: enqueues, never blocks."""

    def __init__(self, owner: Advertiser, tier: str) -> None:
        self._owner, self._tier = owner, tier

    def sealed(self, owner: Hashable, blocks: list[tuple[int, Hashable]]) -> None:
        self._owner.offer(_Stored(self._tier, owner, list(blocks)))

    def unkeyed(self, keys: list[Hashable]) -> None:
        self._owner.offer(_Removed(self._tier, list(keys)))


@dataclass(frozen=True)
class KvEventFigures:
    """Since start: batches sent, changes a full queue dropped (each forces a re-sync),
    full re-syncs; now: block hashes advertised, by medium (the Prometheus series)."""

    batches: int
    dropped: int
    resyncs: int
    advertised: dict[str, int]


class Advertiser:
    """The listener on every tier, the queue and the publishing thread."""

    def __init__(
        self,
        settings: KvEventsSettings,
        tiers: Callable[[], dict[str, HostTier]],
        hasher: Callable[[], BlockHasher],
        source: Callable[[Hashable], Source | None],
        parked: Callable[[], Iterable[tuple[Hashable, str, list[Hashable | None]]]],
    ) -> None:
        self.settings = settings
        self._tiers, self._hasher, self._source, self._parked = tiers, hasher, source, parked
        self._queue: queue.Queue[_Stored | _Removed | list[str]] = queue.Queue(
            settings.max_queue_size
        )
        # medium -> key hash advertised -> the tiers holding it (one event per medium)
        self._held: dict[str, dict[bytes, set[str]]] = {}
        self._pending: list[_Stored] = []  # owner not registered yet
        self._stop = threading.Event()
        self._resync = False
        self.dropped = 0  # items a full queue refused
        self.batches = 0
        self.resyncs = 0
        self._advertised: dict[str, int] = {}  # medium -> hashes held (the thread's copy)
        self.publisher = ZmqPublisher(
            settings.endpoint,
            settings.replay_endpoint,
            settings.topic,
            settings.buffer_steps,
            settings.hwm,
            connect=settings.connect,
        )
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)

    # ---- the park path's side: enqueue only -------------------------------------------

    def attach(self, tiers: Iterable[HostTier]) -> None:
        for tier in tiers:
            tier.add_listener(_Listener(self, tier.name))

    def offer(self, item: _Stored | _Removed | list[str]) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            self._resync = True

    def relayout(self, old: list[HostTier], new: list[HostTier]) -> None:
        """Tiers replaced (Mover.on_relayout): the old ones' blocks are gone."""
        self.attach(new)
        self.offer([t.name for t in old])

    def figures(self) -> KvEventFigures:
        """Read from any thread (a scrape): each figure is one atomic read."""
        return KvEventFigures(self.batches, self.dropped, self.resyncs, dict(self._advertised))

    # ---- life ---------------------------------------------------------------------------

    def start(self) -> None:
        self.attach(self._tiers().values())
        self._thread.start()

    def stop(self) -> None:
        """Stop; a last ``AllBlocksCleared``: nothing here is loadable while it is down."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        try:
            self._send([AllBlocksCleared()])
        finally:
            self.publisher.close()

    def _run(self) -> None:
        try:
            self._send([AllBlocksCleared(), *self._snapshot()])  # a restart's old claims
            while not self._stop.is_set():
                items = self._take()
                events = self._process(items)
                if self.publisher.subscribed():
                    self._resync = True  # a router (re)connected: tell it everything
                if self._resync and self._queue.empty():
                    self._resync = False
                    self.resyncs += 1
                    self._held.clear()
                    self._pending.clear()
                    events = [AllBlocksCleared(), *self._snapshot()]
                self._send(events)
                self._advertised = {m: len(held) for m, held in self._held.items()}
                if self.publisher.has_replay:
                    self.publisher.serve_replay(0)
        except Exception:
            log.exception("kv events: the publishing thread failed; no more events are sent")

    def _take(self) -> list[_Stored | _Removed | list[str]]:
        wait = 0.02 if self.publisher.has_replay or self._pending else 0.05
        try:
            items = [self._queue.get(timeout=wait)]
        except queue.Empty:
            return []
        while len(items) < 4096:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def _send(self, events: list[Event]) -> None:
        if events:
            self.publisher.send(encode_batch(KVEventBatch(time.time(), events)))
            self.batches += 1

    # ---- items -> events ----------------------------------------------------------------

    def _process(self, items: list[_Stored | _Removed | list[str]]) -> list[Event]:
        events: list[Event] = []
        if self._pending:
            retry, self._pending = self._pending, []
            for waiting in retry:
                events += self._stored(waiting)
        for item in items:
            if isinstance(item, _Stored):
                item.until = time.monotonic() + RESOLVE_S
                events += self._stored(item)
            elif isinstance(item, _Removed):
                events += self._removed(item.tier, item.keys)
            else:
                events += self._cleared(item)
        return events

    def _ours(self, key: Hashable | None) -> bytes | None:
        """The hash of a key of the advertised tenant, else None."""
        if isinstance(key, tuple) and len(key) == 2 and key[0] == self.settings.tenant:
            h = key[1]
            return h if isinstance(h, bytes) else None
        return None

    def _stored(self, item: _Stored) -> list[Event]:
        tier = self._tiers().get(item.tier)
        blocks = sorted((i, k) for i, k in item.blocks if self._ours(k) is not None)
        if tier is None or not blocks:
            return []
        src = self._source(item.owner)
        if src is None:
            if time.monotonic() < item.until:
                self._pending.append(item)
            return []
        hasher = self._hasher()
        bs = hasher.block_size
        last = blocks[-1][0]
        if len(src.tokens) < (last + 1) * bs:
            return []
        tokens = src.tokens[: (last + 1) * bs]
        chain = hasher.chain(tokens, cache_salt=src.cache_salt, lora=src.lora)
        held = self._held.setdefault(medium_of(item.tier), {})
        runs: list[list[int]] = []
        for index, key in blocks:
            h = chain[index]
            holders = held.get(h, set())
            if h != self._ours(key) or item.tier in holders or not tier.find([key]):
                continue
            held[h] = holders | {item.tier}
            if holders:
                continue  # another tier of the same medium advertised it already
            if runs and runs[-1][-1] == index - 1:
                runs[-1].append(index)
            else:
                runs.append([index])
        return [self._block_stored(item.tier, run, chain, src, bs) for run in runs]

    def _block_stored(
        self, tier: str, run: list[int], chain: list[bytes], src: Source, bs: int
    ) -> BlockStored:
        fmt = self.settings.block_hashes
        first, last = run[0], run[-1]
        extra: list[tuple[Any, ...] | None] | None = None
        if src.lora is not None or src.cache_salt:
            # vLLM's extra_keys, untagged: the LoRA name, then the salt (first block only).
            extra = []
            for i in run:
                parts: list[Any] = [src.lora.name] if src.lora is not None else []
                if i == 0 and src.cache_salt:
                    parts.append(src.cache_salt)
                extra.append(tuple(parts) or None)
        return BlockStored(
            block_hashes=[external_hash(chain[i], fmt) for i in run],
            parent_block_hash=external_hash(chain[first - 1], fmt) if first > 0 else None,
            token_ids=[int(t) for t in src.tokens[first * bs : (last + 1) * bs]],
            block_size=bs,
            lora_id=None,
            medium=medium_of(tier),
            lora_name=src.lora.name if src.lora is not None else None,
            extra_keys=extra,
        )

    def _removed(self, tier: str, keys: list[Hashable]) -> list[Event]:
        medium = medium_of(tier)
        held = self._held.get(medium, {})
        gone: list[bytes] = []
        for h in (self._ours(k) for k in keys):
            holders = held.get(h) if h is not None else None
            if h is None or holders is None or tier not in holders:
                continue
            holders.discard(tier)
            if not holders:
                del held[h]
                gone.append(h)
        return [self._block_removed(gone, medium)] if gone else []

    def _block_removed(self, gone: list[bytes], medium: str) -> BlockRemoved:
        return BlockRemoved([external_hash(h, self.settings.block_hashes) for h in gone], medium)

    def _cleared(self, tiers: list[str]) -> list[Event]:
        events: list[Event] = []
        for name in tiers:
            medium = medium_of(name)
            held = self._held.get(medium, {})
            gone: list[bytes] = []
            for h, holders in list(held.items()):
                holders.discard(name)
                if not holders:
                    del held[h]
                    gone.append(h)
            if gone:
                events.append(self._block_removed(gone, medium))
        if not any(self._held.values()):
            return [AllBlocksCleared()]  # nothing of this host is left: say it in one event
        return events

    def _snapshot(self) -> list[Event]:
        """Every parked copy that is findable now (start, and after dropped items)."""
        events: list[Event] = []
        for owner, tier, keys in self._parked():
            blocks = [(i, k) for i, k in enumerate(keys) if k is not None]
            events += self._stored(_Stored(tier, owner, blocks, time.monotonic() + RESOLVE_S))
        return events
