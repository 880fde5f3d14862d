"""The source's side of a move: read the parked copy a chunk at a time, push it to the
target, and drop it here only once the target has committed it.

Memory is bounded by one chunk (a reused buffer). A dropped connection is picked up
again: the target is asked what it still lacks, and only that is sent. The session is
held (one operation at a time, agentpark.parking.registry) for the whole move, so nothing
here changes it meanwhile.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence

import httpx

from agentpark.enums import State
from agentpark.errors import AgentparkError, InvalidStateError, TierFullError
from agentpark.integrity import block_digests
from agentpark.moving.blockio import read_blocks
from agentpark.moving.peer import Peer
from agentpark.moving.record import COMMITTING, DONE, SENDING, MoveRecords
from agentpark.moving.wire import (
    BeginAnswer,
    LayoutMismatchError,
    MoveManifest,
    MoveOutResult,
    PeerError,
)
from agentpark.parking.core import SessionCore
from agentpark.parking.handles import keys_hex
from agentpark.parking.registry import LiveSession, SessionKey
from agentpark.store.models import MoveRow
from agentpark.tiers.base import BackendHeldTier, HostTier

__all__ = ["CHUNK_BYTES", "Exporter", "Prepared", "backoff", "unreachable"]

log = logging.getLogger(__name__)

Prepared = tuple[str, bool, MoveManifest]
"""A move made ready (:meth:`Exporter.prepare`): its id, whether an earlier attempt is
picked up, its manifest."""

CHUNK_BYTES = 8 * 2**20
"""The most block bytes one request carries (and the source holds): the target's body
limit lowers it."""
RETRIES = 6


class Exporter:
    """Moves of one session core's parked sessions to other daemons."""

    def __init__(
        self,
        core: SessionCore,
        records: MoveRecords,
        source: str,
        chunk_bytes: int = CHUNK_BYTES,
        retries: int = RETRIES,
    ) -> None:
        self.core = core
        self.records = records
        self.source = source
        self.chunk_bytes = chunk_bytes
        self.retries = retries
        # Sessions in doubt (a commit whose answer was lost): held here, never released
        # until a move run again learns who owns them.
        self.held: dict[SessionKey, LiveSession] = {}
        # One client per target, kept: a drain's moves share its connections (a new
        # client per move cost tens of milliseconds of set-up each).
        self._peers: dict[tuple[str, str], Peer] = {}
        self._peers_lock = threading.Lock()

    def close(self) -> None:
        with self._peers_lock:
            peers, self._peers = list(self._peers.values()), {}
        for peer in peers:
            peer.close()

    def peer(self, to: str, token: str) -> Peer:
        with self._peers_lock:
            peer = self._peers.get((to, token))
            if peer is None:
                peer = self._peers[to, token] = Peer(to, token)
            return peer

    def hold_in_doubt(self) -> int:
        """At start: hold every session whose move was committing when the last process
        ended (the target may own it); close records whose session is gone."""
        held = 0
        for record in self.records.unfinished():
            live = self.core.registry.find((record.tenant, record.session_id))
            if live is None:
                self.records.mark(record.move_id, DONE)
            elif record.state == COMMITTING:
                self.core.registry.acquire(live, _doubt(record.peer))
                self.held[live.key] = live
                held += 1
                log.warning(
                    "session %s/%s is in doubt: its move %s to %s was committing; run "
                    "`agentpark session move` to it again to finish",
                    record.tenant,
                    record.session_id,
                    record.move_id,
                    record.peer,
                )
        return held

    def take(self, key: SessionKey, to: str) -> LiveSession:
        """Hold the session for a move to ``to`` (one held in doubt is held already)."""
        live = self.held.get(key)
        if live is None:
            live = self.core.live(*key)
            self.core.registry.acquire(live, f"move to {to}")
        return live

    def move_taken(
        self, live: LiveSession, to: str, token: str, prepared: Prepared | None = None
    ) -> MoveOutResult:
        """Hand one held session to ``to`` over the per-session routes (a target without
        the batch routes); the session is gone from here on success. ``prepared``: what
        :meth:`prepare` already said of it (its record is open: preparing it again would
        call a first move a resumed one)."""
        try:
            result = self._move(live, to, token, prepared)
        except _InDoubt as doubt:
            self.held[live.key] = live
            raise doubt.error from None
        self.held.pop(live.key, None)
        self.core.registry.release(live)
        return result

    def prepare(self, live: LiveSession, to: str) -> Prepared:
        """The move's id, whether an earlier attempt is picked up, and its manifest; the
        session is let go when it cannot move."""
        prepared = self.prepare_many([live], to)[0]
        if isinstance(prepared, AgentparkError):
            raise prepared
        return prepared

    def prepare_many(
        self, lives: Sequence[LiveSession], to: str
    ) -> list[Prepared | AgentparkError]:
        """:meth:`prepare` of a batch: one query for their open moves, one transaction
        for the new records; an error (the session let go) for one that cannot move."""
        opens = self.records.open_for_many([live.key for live in lives])
        out: list[Prepared | AgentparkError] = []
        new: list[tuple[str, str, str]] = []
        try:
            for live in lives:
                try:
                    move_id, resumed = self._check(live, to, opens.get(live.key))
                    out.append((move_id, resumed, self._manifest(live, move_id)))
                except AgentparkError as exc:
                    out.append(exc)
                    continue
                if not resumed:
                    new.append((move_id, live.row.tenant, live.row.session_id))
            self.records.start_many(new, to)
        except BaseException:
            out += [InvalidStateError("not moved")] * (len(lives) - len(out))
            for live, got in zip(lives, out, strict=True):
                if not isinstance(got, AgentparkError) and live.key not in self.held:
                    self.core.registry.release(live)
            raise
        finally:
            for live, got in zip(lives, out, strict=False):
                if isinstance(got, AgentparkError) and live.key not in self.held:
                    self.core.registry.release(live)
        return out

    def _move(
        self, live: LiveSession, to: str, token: str, prepared: Prepared | None
    ) -> MoveOutResult:
        started = time.perf_counter()
        row = live.row
        to = to.rstrip("/")
        move_id, resumed, manifest = prepared or self.prepare(live, to)
        tier = self.core.tiers.get(row.tier or "")
        peer = self.peer(to, token)
        try:
            sent, held, nbytes, retries = self._push(peer, live, tier, manifest)
        except (TierFullError, LayoutMismatchError, InvalidStateError) as exc:
            # Refused before any commit: the target holds nothing; this one keeps it.
            self.records.mark(move_id, DONE)
            peer.abort(move_id)
            self.let_go(live)
            raise exc
        except _InDoubt:
            raise
        except BaseException as exc:
            if isinstance(exc, AgentparkError):  # the target answered: not committed
                self.records.mark(move_id, SENDING)
            self.let_go(live)
            raise
        try:
            self.core.transitions.moved_out(live, to, move_id)
        except AgentparkError as exc:  # the target owns it; this row could not say so yet
            raise _InDoubt(
                PeerError(
                    f"moved to {to}, but not dropped here: {exc.message}",
                    move_id=move_id,
                    in_doubt=True,
                )
            ) from exc
        self.core.registry.remove(live)
        self.records.mark(move_id, DONE)
        return MoveOutResult(
            move_id=move_id,
            tenant=row.tenant,
            session_id=row.session_id,
            to=to,
            blocks=len(manifest.digests),
            blocks_sent=sent,
            blocks_held=held,
            bytes_sent=nbytes,
            retries=retries,
            resumed=resumed,
            ms=(time.perf_counter() - started) * 1e3,
        )

    def let_go(self, live: LiveSession) -> None:
        """A move that failed before its commit: the session is this daemon's, as it was."""
        if self.held.pop(live.key, None) is not None:
            log.info("session %s/%s is no longer in doubt: the target did not take it", *live.key)
        self.core.registry.release(live)

    def _check(self, live: LiveSession, to: str, open_move: MoveRow | None) -> tuple[str, bool]:
        """The move's id, if the session may move: an unfinished one to the same target is
        picked up (a new one is for the caller to record)."""
        row = live.row
        if row.state != State.PARKED and live.key not in self.held:
            raise InvalidStateError(
                f"only a parked session moves; {row.session_id!r} is {row.state} (pause it first)",
                state=row.state,
            )
        if open_move is not None and open_move.peer == to:
            return open_move.move_id, True
        if open_move is not None and open_move.state == COMMITTING:
            raise InvalidStateError(
                f"session {live.row.session_id!r} is in doubt: its move to {open_move.peer} "
                "was committing; move it to that daemon again to finish",
                peer=open_move.peer,
            )
        if open_move is not None:
            self.records.mark(open_move.move_id, DONE)  # never committed: nothing to undo
        return uuid.uuid4().hex, False

    def _manifest(self, live: LiveSession, move_id: str) -> MoveManifest:
        row, geometry = live.row, self.core.geometry
        tier = self.core.tiers.get(row.tier or "")
        digests: list[str] = []
        keys: list[str | None] = []
        if row.state == State.PARKED:
            if tier is None or isinstance(tier, BackendHeldTier):
                raise InvalidStateError(
                    f"session {row.session_id!r} is parked where this daemon cannot read it "
                    f"({row.tier})",
                    state=row.state,
                )
            recorded = live.digests
            if recorded is not None and all(d is not None for d in recorded):
                digests = [str(d) for d in recorded]
            else:
                digests = block_digests(tier, live.slots)
            keys = keys_hex(live.keys or [None] * len(live.slots))
        return MoveManifest(
            move_id=move_id,
            source=self.source,
            tenant=row.tenant,
            session_id=row.session_id,
            model_uid=self.core.host.model_uid,
            block_size=geometry.block_size,
            arrays=[(list(a.block_shape), a.dtype) for a in geometry.arrays],
            token_log=base64.b64encode(row.token_log or b"").decode(),
            next_logits=None
            if row.next_logits is None
            else base64.b64encode(row.next_logits).decode(),
            metadata=dict(row.meta or {}),
            tool=row.tool,
            paused_at=row.paused_at,
            expected_resume_at=row.expected_resume_at,
            created_at=row.created_at,
            last_active_at=row.last_active_at,
            pause_count=row.pause_count,
            keys=keys,
            digests=digests,
        )

    def send_chunks(
        self,
        peer: Peer,
        live: LiveSession,
        tier: HostTier,
        move_id: str,
        answer: BeginAnswer,
        buf: bytearray,
    ) -> int:
        """The missing blocks of ``answer`` in HTTP chunks (a chunk at a time in ``buf``);
        how many were sent."""
        block = self.core.geometry.block_nbytes
        per_chunk = max(1, min(self.chunk_bytes, answer.max_chunk_bytes) // block)
        sent = 0
        for idxs in _chunks(answer.missing, per_chunk):
            data = read_blocks(tier, [live.slots[i] for i in idxs], buf)
            peer.chunk(move_id, idxs, data)
            sent += len(idxs)
        return sent

    def _push(
        self, peer: Peer, live: LiveSession, tier: HostTier | None, manifest: MoveManifest
    ) -> tuple[int, int, int, int]:
        """Begin, send what is missing, commit; again after a dropped connection.
        Returns (blocks sent, blocks the target held, bytes sent, retries)."""
        move_id = manifest.move_id
        block = self.core.geometry.block_nbytes
        sent = held = retries = 0
        committing = False
        buf = bytearray()
        while True:
            try:
                answer = peer.begin(manifest)
                if answer.committed:
                    return sent, held, sent * block, retries
                if tier is None:  # in doubt and not parked here any more: the target lacks it
                    raise InvalidStateError("the target does not hold this session", peer=peer.url)
                held = answer.held
                sent += self.send_chunks(peer, live, tier, move_id, answer, buf)
                if not committing:
                    self.records.mark(move_id, COMMITTING)
                    committing = True
                peer.commit(move_id)
                return sent, held, sent * block, retries
            except httpx.TransportError as exc:
                retries += 1
                if retries > self.retries:
                    error = unreachable(peer.url, move_id, exc, committing)
                    if committing:
                        raise _InDoubt(error) from exc
                    raise error from exc
                log.info("move %s: %r; asking %s what it still lacks", move_id, exc, peer.url)
                backoff(retries)


def unreachable(url: str, move_id: str, exc: Exception, committing: bool) -> PeerError:
    """A move that gave up on a dropped connection (kept, to be picked up)."""
    said = (
        f"the target {url} could not be reached ({exc!r}); move "
        f"{move_id} is kept: run the move again to pick it up"
    )
    return PeerError(said, peer=url, move_id=move_id, in_doubt=committing)


def backoff(retries: int) -> None:
    """The pause before the ``retries``-th try after a dropped connection."""
    time.sleep(min(2.0, 0.05 * 2**retries))


class _InDoubt(Exception):
    """The commit was asked and no answer seen: the session is held here."""

    def __init__(self, error: PeerError) -> None:
        super().__init__(error.message)
        self.error = error


def _doubt(peer: str) -> str:
    return f"move to {peer} (in doubt: run the move again)"


def _chunks(indices: Sequence[int], size: int) -> Iterator[list[int]]:
    for i in range(0, len(indices), size):
        yield list(indices[i : i + size])
