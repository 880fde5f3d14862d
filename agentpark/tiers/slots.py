"""A tier's slots as a store of blocks addressed by content, refcounted by their holders.

A slot holds one block. A block with a key (agentpark.kvkeys, namespaced by the caller:
e.g. ``(tenant, block_hash)``) is stored once: every holder that needs that key refers to
the same slot, and the slot is let go when its last holder does. A block without a key
(a partial last block, a copy parked before keys) is private to its one holder.

A slot's life::

    reserve (fresh: pending, for its owner to fill)
      -> seal (its copy landed and committed: published under its key, with its digest)
      -> held by 1..n owners (reserve of the same key, hold of a load)
      -> cached (no owner left after a restore: still findable by key; the first to go
         when room is needed), or free (no owner left after a drop)

Only sealed blocks are shared or found, so nobody ever reads a block whose copy is not in.
Thread-safe. Nothing here moves bytes or hashes them (the mover does).

Listeners (:class:`SlotListener`, e.g. agentpark.kvevents) hear the two transitions a
router cares about, at the one place each happens: a key becomes findable (seal, claim)
and a key stops being findable (freed, evicted from the cache, forgotten as corrupt).
They are called inside the lock, in order, and must only enqueue.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agentpark.blocks import PoolExhaustedError

__all__ = ["Reservation", "SlotListener", "SlotStore"]


@dataclass
class Reservation:
    """What :meth:`SlotStore.reserve` gave an owner: a slot per block, and which are new."""

    slots: list[int]
    fresh: list[bool]
    keys: list[Hashable | None] = field(default_factory=list)

    @property
    def to_copy(self) -> list[int]:
        """Positions (block indices) whose bytes must be copied into their slot."""
        return [i for i, new in enumerate(self.fresh) if new]


class SlotListener(Protocol):
    """Told, under the store's lock and in order, when keys become or stop being findable."""

    def sealed(self, owner: Hashable, blocks: list[tuple[int, Hashable]]) -> None:
        """``owner``'s blocks (block index in its copy, key) are findable now."""

    def unkeyed(self, keys: list[Hashable]) -> None:
        """These keys are no longer findable here."""


class SlotStore:
    """Slots ``0..capacity-1``: owners' references, keys of sealed blocks, an LRU of cached."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self._capacity = capacity
        self._lock = threading.Lock()
        self._free: deque[int] = deque(range(capacity))
        self._refs: dict[int, dict[Hashable, int]] = {}  # slot -> owners (with counts)
        self._of: dict[Hashable, list[int]] = {}  # owner -> slots, block order
        self._pending: dict[int, tuple[Hashable, Hashable | None]] = {}  # slot -> owner, key
        self._key_of: dict[int, Hashable] = {}  # sealed slot -> key
        self._slot_of: dict[Hashable, int] = {}  # key -> sealed slot
        self._digest: dict[int, str | None] = {}  # sealed slot -> digest of its bytes
        self._cached: OrderedDict[int, None] = OrderedDict()  # sealed, no owner; LRU first
        self.listeners: list[SlotListener] = []
        self._gone: list[Hashable] = []  # keys unkeyed by the operation in progress

    # ---- figures ---------------------------------------------------------------------------

    @property
    def total(self) -> int:
        return self._capacity

    @property
    def num_used(self) -> int:
        """Slots some owner holds (a cached block is room: it goes when room is needed)."""
        with self._lock:
            return len(self._refs)

    @property
    def num_cached(self) -> int:
        with self._lock:
            return len(self._cached)

    @property
    def num_free(self) -> int:
        with self._lock:
            return len(self._free) + len(self._cached)

    def owned(self, owner: Hashable) -> list[int]:
        with self._lock:
            return list(self._of.get(owner, []))

    def digest(self, slot: int) -> str | None:
        """The digest a sealed slot's bytes had when they landed (None: not checksummed)."""
        with self._lock:
            return self._digest.get(slot)

    def find(self, keys: Sequence[Hashable]) -> list[int]:
        """The slots of the longest prefix of ``keys`` sealed here."""
        found: list[int] = []
        with self._lock:
            for key in keys:
                slot = self._slot_of.get(key)
                if slot is None:
                    break
                found.append(slot)
        return found

    # ---- owners -----------------------------------------------------------------------------

    def reserve(self, owner: Hashable, keys: Sequence[Hashable | None]) -> Reservation:
        """A slot per key for ``owner``: the sealed slot of a key already here (shared, not
        copied), else a fresh one (pending until :meth:`seal`). All or nothing:
        PoolExhaustedError when the fresh ones do not fit (cached blocks are evicted first,
        oldest first, only when the whole reservation fits)."""
        with self._lock:
            shared = [self._slot_of.get(k) if k is not None else None for k in keys]
            # A block this reservation shares is in use, so it is no room to evict.
            needed = sum(1 for s in shared if s is None)
            keep = {s for s in shared if s is not None}
            room = len(self._free) + sum(1 for s in self._cached if s not in keep)
            if needed > room:
                raise PoolExhaustedError(needed, room, self._capacity)
            slots: list[int] = []
            for key, slot in zip(keys, shared, strict=True):
                if slot is None:
                    slot = self._take(keep)
                    self._pending[slot] = (owner, key)
                slots.append(slot)
            self._ref_all(owner, slots)
            key_of = self._key_of
            fresh = [slot not in key_of for slot in slots]
            self._tell_gone()  # cached blocks evicted to make room
            return Reservation(slots, fresh, list(keys))

    def seal(
        self,
        owner: Hashable,
        digests: dict[int, str | None],
        *,
        announce_as: Hashable | None = None,
    ) -> None:
        """``owner``'s pending slots hold their copies now (``digests`` by slot): a keyed
        one becomes findable, unless the same key was sealed meanwhile (it stays private).
        ``announce_as``: the session the listeners are told holds them, when ``owner`` is
        only a stand-in for it (a move's import, sealed before the session is added)."""
        with self._lock:
            published: list[tuple[int, Hashable]] = []
            pending, slot_of, key_of = self._pending, self._slot_of, self._key_of
            digest = self._digest
            for index, slot in enumerate(self._of.get(owner, [])):
                waiting = pending.get(slot)
                if waiting is None or waiting[0] != owner:
                    continue
                del pending[slot]
                key = waiting[1]
                digest[slot] = digests.get(slot)
                if key is not None and key not in slot_of:
                    slot_of[key] = slot
                    key_of[slot] = key
                    published.append((index, key))
            self._tell_sealed(owner if announce_as is None else announce_as, published)

    def hold(self, owner: Hashable, slots: Sequence[int]) -> None:
        """Add ``owner``'s reference to sealed slots (a load reading them keeps them)."""
        with self._lock:
            bad = [s for s in slots if s not in self._digest or s in self._pending]
            if bad:
                raise ValueError(f"slots not sealed: {bad[:10]}")
            self._ref_all(owner, slots)

    def hand_over(self, owner: Hashable, to: Hashable) -> None:
        """Every reference of ``owner`` becomes ``to``'s (a move's import, sealed, becomes
        its session's): one pass, where :meth:`hold` then :meth:`release` take two."""
        with self._lock:
            slots = self._of.pop(owner, [])
            if not slots:
                return
            refs = self._refs
            for slot in dict.fromkeys(slots):
                held = refs[slot]
                held[to] = held.get(to, 0) + held.pop(owner)
            pending = self._pending
            for slot in slots:
                waiting = pending.get(slot)
                if waiting is not None and waiting[0] == owner:
                    pending[slot] = (to, waiting[1])
            self._of.setdefault(to, []).extend(slots)

    def claim(
        self,
        owner: Hashable,
        slots: Sequence[int],
        keys: Sequence[Hashable | None] | None = None,
        digests: Sequence[str | None] | None = None,
    ) -> None:
        """Re-attach slots recorded in SQLite (start-up): sealed, keyed as recorded. A slot
        two owners recorded must have the same key in both; a key recorded for two slots
        (two parks of the same block raced) keys the first, the other stays private. All
        or nothing (ValueError)."""
        keys = list(keys) if keys is not None else [None] * len(slots)
        digests = list(digests) if digests is not None else [None] * len(slots)
        if not len(keys) == len(digests) == len(slots):
            raise ValueError("slots, keys and digests differ in length")
        with self._lock:
            if len(set(slots)) != len(slots):
                raise ValueError(f"duplicate slots in claim: {list(slots)[:10]}")
            for i, (slot, key) in enumerate(zip(slots, keys, strict=True)):
                if not 0 <= slot < self._capacity:
                    raise ValueError(f"slot {slot} out of range")
                if key is not None and self._slot_of.get(key, slot) != slot:
                    keys[i] = key = None
                taken = slot in self._refs or slot in self._cached
                if taken and (key is None or self._key_of.get(slot) != key):
                    raise ValueError(f"slot {slot} is another copy's")
            claimed = set(slots)
            self._free = deque(s for s in self._free if s not in claimed)
            published: list[tuple[int, Hashable]] = []
            for index, (slot, key, digest) in enumerate(zip(slots, keys, digests, strict=True)):
                self._cached.pop(slot, None)
                if slot not in self._refs:
                    self._digest[slot] = digest
                    if key is not None and slot not in self._key_of:
                        self._slot_of[key] = slot
                        self._key_of[slot] = key
                        published.append((index, key))
                self._ref_all(owner, [slot])
            self._tell_sealed(owner, published)

    def release(self, owner: Hashable, *, cache: bool = False) -> list[int]:
        """Drop every reference of ``owner``; returns the slots that became free. With
        ``cache``, a sealed keyed block with no owner left is cached instead (findable
        until room is needed): for a copy whose session took it back, not one dropped."""
        freed: list[int] = []
        with self._lock:
            all_refs, pending, key_of = self._refs, self._pending, self._key_of
            for slot in self._of.pop(owner, []):
                refs = all_refs[slot]
                left = refs[owner] - 1
                if left > 0:
                    refs[owner] = left
                    continue
                del refs[owner]
                if refs:
                    continue
                del all_refs[slot]
                if slot in pending and pending[slot][0] == owner:
                    del pending[slot]
                if cache and slot in key_of:
                    self._cached[slot] = None
                else:
                    freed.append(slot)
            self._drop_all(freed)
            self._tell_gone()
        return freed

    def forget(self, slots: Sequence[int]) -> None:
        """The bytes of these slots are no longer the block their key says (a failed
        checksum): unkey them, so nobody else is given them (their holders keep them)."""
        with self._lock:
            for slot in slots:
                self._unkey(slot)
                if slot in self._cached:
                    del self._cached[slot]
                    self._drop_all([slot])
            self._tell_gone()

    # ---- inside the lock ----------------------------------------------------------------------

    def _ref_all(self, owner: Hashable, slots: Sequence[int]) -> None:
        """One more reference of ``owner`` to each of ``slots`` (a slot twice: two)."""
        refs = self._refs
        for slot in slots:
            held = refs.get(slot)
            if held is None:
                refs[slot] = {owner: 1}
            else:
                held[owner] = held.get(owner, 0) + 1
        self._of.setdefault(owner, []).extend(slots)
        if self._cached:
            for slot in slots:
                self._cached.pop(slot, None)

    def _take(self, keep: set[int]) -> int:
        if self._free:
            return self._free.popleft()
        for slot in self._cached:
            if slot not in keep:
                del self._cached[slot]
                self._unkey(slot)
                self._digest.pop(slot, None)
                return slot
        raise AssertionError("no room although the reservation was checked")

    def _unkey(self, slot: int) -> None:
        key = self._key_of.pop(slot, None)
        if key is not None:
            del self._slot_of[key]
            self._gone.append(key)

    def _tell_sealed(self, owner: Hashable, published: list[tuple[int, Hashable]]) -> None:
        if published:
            for listener in self.listeners:
                listener.sealed(owner, published)

    def _tell_gone(self) -> None:
        gone, self._gone = self._gone, []
        if gone:
            for listener in self.listeners:
                listener.unkeyed(gone)

    def _drop_all(self, slots: list[int]) -> None:
        """Unkey these slots, forget their digests, make them free."""
        for slot in slots:
            self._unkey(slot)
            self._digest.pop(slot, None)
        self._free.extend(slots)

    def check_invariants(self) -> None:
        """AssertionError when the bookkeeping disagrees with itself (tests)."""
        with self._lock:
            free = set(self._free)
            used = set(self._refs)
            cached = set(self._cached)
            if len(free) != len(self._free):
                raise AssertionError("a slot is twice in the free list")
            if free & used or free & cached or used & cached:
                raise AssertionError("a slot is in two of free, used and cached")
            if len(free) + len(used) + len(cached) != self._capacity:
                raise AssertionError("free + used + cached != capacity")
            by_owner = Counter(s for slots in self._of.values() for s in slots)
            if by_owner != Counter({s: sum(c.values()) for s, c in self._refs.items()}):
                raise AssertionError("owners' slots disagree with the slots' references")
            for key, slot in self._slot_of.items():
                if self._key_of.get(slot) != key:
                    raise AssertionError(f"key of slot {slot} disagrees")
            if not cached <= set(self._key_of):
                raise AssertionError("a cached slot has no key")
