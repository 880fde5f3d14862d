"""The mover: reserves tier slots and moves block bytes between an engine's pool and tiers.

Bookkeeping and bytes are apart, as in vLLM's kv_offload: :meth:`Mover.reserve` takes
slots (all or nothing, one 507 naming every tier tried), the session core commits or
frees them, and :meth:`Mover.copy` moves bytes through a handler chosen by the (source
medium, destination medium) pair:

=================  =====================================================================
(pool, host)       the DMA backend's ``d2h``: an engine's device pool into a tier
(host, pool)       the DMA backend's ``h2d``: a tier back into an engine's pool
(host, host)       memcpy per run consecutive on both sides: tier to tier (drain,
                   demotion), or an external engine's host-resident pool
=================  =====================================================================

Slots hold blocks addressed by content (agentpark.tiers.slots): a reservation shares
the slots of keys the tier already holds and takes fresh ones for the rest, so a park
copies only the blocks the tier lacks. A block key is vLLM's hash chain (agentpark.kvkeys)
namespaced by tenant, so no block crosses tenants.

Checksums (agentpark.integrity) are of the copy as it sits in the tier: a digest per
block for copies stored by content (taken from the tier once the copy landed, checked
before a restore copies), one for the whole copy for those parked before keys. Those are
still restored through ``copy(..., hash=True)``: a handler that can hashes each piece
while it copies (host_copy: the piece is still in cache) and returns the checksum; one
that cannot returns None, and :meth:`Mover.restore` hashes the tier itself.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from agentpark.blocks import PoolGeometry, paired_runs
from agentpark.dma.base import Transfer
from agentpark.engine.base import EngineAdapter
from agentpark.enums import Medium, TierChoice
from agentpark.errors import InvalidRequestError, TierFullError, TransferError
from agentpark.integrity import block_digests, blocks_intact, checksum, fusable, matches
from agentpark.kvkeys import DEFAULT_SEED, BlockHasher, HashAlgo
from agentpark.tiers.base import BackendHeldTier, HostTier
from agentpark.tiers.slots import Reservation

__all__ = ["ArrayPool", "Endpoint", "EnginePool", "Expected", "Mover", "copy_host_blocks"]

Expected = str | Sequence[str | None] | None
"""What a parked copy must hash to: a digest per block (stored by content), one checksum
of the whole copy (parked before keys), or nothing (an unchecksummed tier)."""


class Endpoint(Protocol):
    @property
    def medium(self) -> Medium: ...


class HostBuffers(Endpoint, Protocol):
    def buffers(self) -> list[np.ndarray]: ...


@dataclass(frozen=True)
class EnginePool:
    """An in-process engine's pool, as a copy source or destination."""

    engine: EngineAdapter
    medium: Medium = Medium.POOL


@dataclass(frozen=True)
class ArrayPool:
    """A pool held as host numpy arrays, one per pool array, block axis first.

    What an external engine whose KV lives in host memory hands the core (a CPU engine
    in this process; the fake engine of the tests).
    """

    arrays: tuple[np.ndarray, ...]
    medium: Medium = Medium.HOST

    def buffers(self) -> list[np.ndarray]:
        return list(self.arrays)


Handler = Callable[[Any, Sequence[int], Any, Sequence[int], bool], str | None]


def copy_host_blocks(
    src: HostBuffers,
    src_ids: Sequence[int],
    dst: HostBuffers,
    dst_ids: Sequence[int],
    digest: bool = False,
) -> str | None:
    """Copy ``src`` row ``src_ids[i]`` to ``dst`` row ``dst_ids[i]`` in every buffer.

    Unfused: returns None even with ``digest`` (the mover hashes the tier itself).
    """
    starts, dests, sizes = paired_runs(src_ids, dst_ids)
    for src_buf, dst_buf in zip(src.buffers(), dst.buffers(), strict=True):
        for s, d, n in zip(starts, dests, sizes, strict=True):
            np.copyto(dst_buf[d : d + n], src_buf[s : s + n])
    return None


class Mover:
    """Tier slots and the copies between them and a pool, for the session core."""

    def __init__(
        self,
        geometry: PoolGeometry,
        tiers: Sequence[HostTier],
        transfer: Transfer | None,
        checksum_tiers: frozenset[str],
        *,
        key_algo: HashAlgo = "sha256",
        key_seed: str = DEFAULT_SEED,
    ) -> None:
        self.geometry = geometry
        self._key_algo, self._key_seed = key_algo, key_seed
        self.hasher = BlockHasher(geometry.block_size, key_algo, key_seed)
        # In auto order: the first with room takes a pause (dram, then shm, then disk).
        self.tiers: dict[str, HostTier] = {t.name: t for t in tiers}
        self.transfer = transfer
        self.checksum_tiers = checksum_tiers
        # Measured copy speed (bytes/s, moving average of pauses and restores): the
        # break-even and prefetch rules price a round trip with it.
        self.bandwidth_bps = 5e9
        self.on_relayout: list[Callable[[list[HostTier], list[HostTier]], None]] = []
        self._handlers: dict[tuple[Medium, Medium], Handler] = {
            (Medium.HOST, Medium.HOST): copy_host_blocks,
        }
        if transfer is not None:
            self._handlers[Medium.POOL, Medium.HOST] = self._device_to_host
            self._handlers[Medium.HOST, Medium.POOL] = self._host_to_device

    def relayout(self, geometry: PoolGeometry, tiers: Sequence[HostTier]) -> None:
        """An engine with a new layout: copies go between its pool and these tiers now."""
        old = list(self.tiers.values())
        self.geometry = geometry
        self.tiers = {t.name: t for t in tiers}
        self.hasher = BlockHasher(geometry.block_size, self._key_algo, self._key_seed)
        for hook in self.on_relayout:  # agentpark.kvevents: the old tiers' blocks are gone
            hook(old, list(tiers))

    # ---- which tier ---------------------------------------------------------------------

    def candidates(self, choice: str, *, persistent_only: bool = False) -> list[HostTier]:
        """The tiers a pause may use, in order; 422 for an unknown or disabled tier."""
        if choice not in set(TierChoice):
            names = ", ".join(TierChoice)
            raise InvalidRequestError(f"unknown tier {choice!r}; one of {names}", tier=choice)
        enabled = [t for t in self.tiers.values() if not persistent_only or t.persistent]
        if choice == TierChoice.AUTO:
            return enabled
        tier = self.tiers.get(choice)
        if tier is None:
            names = ", ".join(["auto", *self.tiers])
            raise InvalidRequestError(
                f"tier {choice!r} is not enabled on this daemon; enabled: {names}", tier=choice
            )
        return [tier]

    def reserve(
        self, owner: Hashable, candidates: Sequence[HostTier], keys: Sequence[Hashable | None]
    ) -> tuple[HostTier, Reservation]:
        """A slot per block (``keys``: each block's key, None for a private block) in the
        first candidate with room for the blocks it lacks, or one 507 naming all."""
        failures: dict[str, Any] = {}
        for tier in candidates:
            try:
                return tier, tier.reserve(owner, keys)
            except TierFullError as exc:
                failures[tier.name] = {
                    "free_blocks": exc.details["free_blocks"],
                    "capacity_blocks": exc.details["capacity_blocks"],
                }
        n = len(keys)
        block = self.geometry.block_nbytes
        names = ", ".join(failures) or "none enabled"
        raise TierFullError(
            f"no tier has room for {n} blocks ({n * block} bytes): {names}",
            needed_blocks=n,
            tiers=failures,
        )

    # ---- bytes --------------------------------------------------------------------------

    def copy(
        self,
        src: Endpoint,
        src_ids: Sequence[int],
        dst: Endpoint,
        dst_ids: Sequence[int],
        hash: bool = False,
    ) -> str | None:
        """Move blocks ``src_ids[i] -> dst_ids[i]`` with the handler for the two media.

        ``hash``: return the checksum of the tier side, taken during the copy, or None when
        the handler cannot fuse it (then nothing was hashed).
        """
        handler = self._handlers.get((src.medium, dst.medium))
        if handler is None:
            raise TransferError(f"no copy handler from {src.medium} to {dst.medium}")
        return handler(src, src_ids, dst, dst_ids, hash)

    def _device_to_host(
        self, src: EnginePool, ids: Sequence[int], dst: HostTier, slots: Sequence[int], hash: bool
    ) -> str | None:
        assert self.transfer is not None
        return self.transfer.d2h(src.engine, ids, dst, slots, digest=hash)

    def _host_to_device(
        self, src: HostTier, slots: Sequence[int], dst: EnginePool, ids: Sequence[int], hash: bool
    ) -> str | None:
        assert self.transfer is not None
        return self.transfer.h2d(src, slots, dst.engine, ids, digest=hash)

    def checksummed(self, tier: HostTier) -> bool:
        """Whether copies in ``tier`` get a checksum (``integrity.tiers``).

        Never for a tier whose bytes a DMA backend holds (tpu_sync): agentpark cannot read
        them, so it claims no checksum of them.
        """
        return tier.name in self.checksum_tiers and not isinstance(tier, BackendHeldTier)

    def restore(
        self,
        tier: HostTier,
        slots: Sequence[int],
        parked_slots: Sequence[int],
        dst: Endpoint,
        ids: Sequence[int],
        expected: Expected,
    ) -> bool:
        """Copy ``slots`` of ``tier`` (a prefix of ``parked_slots``) into ``ids`` of ``dst``.

        False when the parked copy fails its checksum: ``dst``'s blocks then hold no
        restore and must not be used (the caller recomputes into them or frees them). A
        whole copy is verified as it goes (the tier is read once); a prefix, or a copy
        parked under the old checksum, is verified first and not copied if damaged.
        """
        if expected is None or not self.checksummed(tier):
            self.copy(tier, slots, dst, ids)
            return True
        if not isinstance(expected, str):  # a digest per block: each verified, then copied
            if not blocks_intact(tier, slots, list(expected)[: len(slots)]):
                return False
            self.copy(tier, slots, dst, ids)
            return True
        if len(slots) != len(parked_slots) or not fusable(expected):
            if not matches(tier, parked_slots, expected):
                return False
            self.copy(tier, slots, dst, ids)
            return True
        got = self.copy(tier, slots, dst, ids, hash=True)
        if got is None:  # unfused backend: the tier is unchanged, hash it now
            got = checksum(tier, slots)
        return got == expected

    def intact(self, tier: HostTier, slots: Sequence[int], expected: Expected) -> bool:
        """Whether a parked copy still matches the checksum taken when it landed."""
        if expected is None or not self.checksummed(tier):
            return True
        if not isinstance(expected, str):
            return blocks_intact(tier, slots, list(expected))
        return matches(tier, slots, expected)

    def block_digests(self, tier: HostTier, slots: Sequence[int]) -> list[str | None]:
        """The digest of each slot's block, or None each where ``tier`` is not checksummed."""
        if not self.checksummed(tier):
            return [None] * len(slots)
        return list(block_digests(tier, slots))

    def fill(
        self, src: Endpoint, src_ids: Sequence[int], dst: HostTier, res: Reservation
    ) -> dict[int, str | None]:
        """Copy the blocks ``res`` lacks (``src_ids[i]`` into ``res.slots[i]`` for its
        fresh ``i``), make them durable; their digests by slot, for :meth:`HostTier.seal`."""
        pos = res.to_copy
        slots = [res.slots[i] for i in pos]
        self.copy(src, [src_ids[i] for i in pos], dst, slots)
        dst.flush()
        return dict(zip(slots, self.block_digests(dst, slots), strict=True))

    def measured(self, nbytes: int, elapsed_ms: float) -> None:
        if nbytes > 0 and elapsed_ms > 0:
            self.bandwidth_bps = 0.8 * self.bandwidth_bps + 0.2 * nbytes / (elapsed_ms / 1e3)
