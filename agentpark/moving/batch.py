"""The source's side of a batch: many parked sessions handed to one target with one begin,
one data connection (or HTTP chunks), one commit on the target (one SQLite transaction
there) and one drop here (one transaction here), instead of three round trips each.

Every guarantee of a single move holds per session: a session the target refuses (507,
409) stays here untouched while the others go; a dropped connection is picked up (the
target says what it still lacks, only that is sent again); the target commits before this
daemon drops, and a batch whose commit answer was lost is held here in doubt, each
session, until a move is run again (agentpark.moving.exports). A target without the batch
routes (an older daemon) is moved to one session at a time.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from agentpark.errors import AgentparkError, InvalidStateError, TierFullError
from agentpark.moving.datasend import DataCut, Outgoing, send_blocks
from agentpark.moving.exports import Exporter, backoff, unreachable
from agentpark.moving.peer import BodyTooLarge, Peer
from agentpark.moving.record import COMMITTING, DONE, SENDING
from agentpark.moving.wire import (
    MAX_BATCH,
    BatchBeginAnswer,
    BatchCommitAnswer,
    LayoutMismatchError,
    MoveManifest,
    MoveOutResult,
    PeerError,
)
from agentpark.parking.registry import LiveSession, SessionKey
from agentpark.tiers.base import HostTier

__all__ = ["BatchExporter", "Outcome"]

log = logging.getLogger(__name__)

Outcome = MoveOutResult | AgentparkError
_REFUSED = (TierFullError, LayoutMismatchError, InvalidStateError)


class _Pushed(enum.Enum):
    DONE = "done"  # every entry committed at the target, or its outcome set
    SMALLER = "smaller"  # the begin was too large for the target: nothing happened
    LEGACY = "legacy"  # the target has no batch routes: nothing happened


@dataclass
class _Entry:
    live: LiveSession
    move_id: str
    resumed: bool
    manifest: MoveManifest
    size: int  # the manifest's JSON bytes
    tier: HostTier | None
    sent: int = 0
    held: int = 0
    retries: int = 0
    via_data: bool = False
    committed: bool = False
    outcome: Outcome | None = None


class BatchExporter:
    """Batches of an exporter's moves; ``data``: use a target's data port when offered."""

    def __init__(self, exporter: Exporter, data: bool = True, timeout_s: float = 60.0) -> None:
        self.exporter = exporter
        self.data = data
        self.timeout_s = timeout_s
        # Where a target's data port is reached (tests put a proxy in between).
        self.data_address: Callable[[str, int], tuple[str, int]] = lambda host, port: (host, port)

    def move_many(self, keys: Sequence[SessionKey], to: str, token: str) -> list[Outcome]:
        """Hand these sessions to ``to``: a result or the error, per session, in order."""
        started = time.perf_counter()
        to = to.rstrip("/")
        outcomes: dict[SessionKey, Outcome] = {}
        entries = self._take(keys, to, outcomes)
        peer = self.exporter.peer(to, token)
        at = 0
        while at < len(entries):
            batch = _batch(entries, at, peer.body_budget)
            pushed = self._push(peer, batch)
            if pushed is _Pushed.SMALLER:  # the target's body limit, learned: again
                continue
            at += len(batch)
            if pushed is _Pushed.LEGACY:  # an older target: one session at a time
                for e in batch:
                    e.outcome = self._one(e, to, token)
                continue
            self._drop(to, [e for e in batch if e.outcome is None], started)
        for e in entries:
            assert e.outcome is not None
            outcomes[e.live.key] = e.outcome
        return [outcomes[k] for k in keys]

    def _take(
        self, keys: Sequence[SessionKey], to: str, outcomes: dict[SessionKey, Outcome]
    ) -> list[_Entry]:
        """Hold and prepare each session (records and manifests); a refusal into
        ``outcomes``."""
        exporter = self.exporter
        lives: list[LiveSession] = []
        for key in keys:
            try:
                lives.append(exporter.take(key, to))
            except AgentparkError as exc:
                outcomes[key] = exc
        entries: list[_Entry] = []
        for live, prepared in zip(lives, exporter.prepare_many(lives, to), strict=True):
            if isinstance(prepared, AgentparkError):
                outcomes[live.key] = prepared
                continue
            move_id, resumed, manifest = prepared
            tier = exporter.core.tiers.get(live.row.tier or "")
            size = len(manifest.model_dump_json())
            entries.append(_Entry(live, move_id, resumed, manifest, size, tier))
        return entries

    def _one(self, e: _Entry, to: str, token: str) -> Outcome:
        try:
            return self.exporter.move_taken(e.live, to, token, (e.move_id, e.resumed, e.manifest))
        except AgentparkError as exc:
            return exc

    def _push(self, peer: Peer, batch: list[_Entry]) -> _Pushed:
        """Begin, send what is missing, commit; again after a dropped connection. Sets
        each entry's outcome where it failed."""
        records = self.exporter.records
        retries, committing = 0, False
        pending = batch

        def asking_commit() -> None:
            """Recorded before the target is asked to commit, on whichever path."""
            nonlocal committing
            if not committing:
                records.mark_many([e.move_id for e in pending], COMMITTING)
                committing = True

        while pending:
            try:
                answer = peer.begin_batch([e.manifest for e in pending], self.data)
                if answer is None:
                    return _Pushed.LEGACY
                pending = self._begun(peer, pending, answer)
                done = self._send(peer, pending, answer, asking_commit)
                asking_commit()
                self._commit(peer, [e for e in pending if not e.committed], done)
                return _Pushed.DONE
            except BodyTooLarge:
                return _Pushed.SMALLER
            except (httpx.TransportError, DataCut) as exc:
                retries += 1
                for e in pending:
                    e.retries = retries
                if retries > self.exporter.retries:
                    for e in pending:
                        e.outcome = unreachable(peer.url, e.move_id, exc, committing)
                        if committing:  # the target may own it: held here in doubt
                            self.exporter.held[e.live.key] = e.live
                        else:
                            self.exporter.let_go(e.live)
                    return _Pushed.DONE
                log.info("moves to %s: %r; asking what it still lacks", peer.url, exc)
                backoff(retries)
            except AgentparkError as exc:  # the target answered: nothing committed
                self._refused(peer, [e for e in pending if e.outcome is None], exc)
                return _Pushed.DONE
            except BaseException:
                for e in pending:
                    self.exporter.let_go(e.live)
                raise
        return _Pushed.DONE

    def _begun(self, peer: Peer, pending: list[_Entry], answer: BatchBeginAnswer) -> list[_Entry]:
        """Read the begin's answer into the entries; those still to move."""
        by_id = {item.move_id: item for item in answer.items}
        left: list[_Entry] = []
        for e in pending:
            item = by_id.get(e.move_id)
            begin = None if item is None else item.begin
            if begin is None:
                refusal = None if item is None else item.refused
                error = (
                    peer.refused(refusal)
                    if refusal is not None
                    else PeerError("the target's begin did not name this move")
                )
                self._refused(peer, [e], error)
                continue
            e.committed, e.held = begin.committed, begin.held
            if begin.missing and e.tier is None:  # in doubt, not parked here: the target lacks it
                self._refused(peer, [e], InvalidStateError("the target does not hold it"))
                continue
            left.append(e)
        return left

    def _send(
        self,
        peer: Peer,
        pending: list[_Entry],
        answer: BatchBeginAnswer,
        asking_commit: Callable[[], None],
    ) -> BatchCommitAnswer | None:
        """Send the missing blocks; the commit's answer where the target took the commit on
        the data connection (agentpark.moving.dataport), else None."""
        missing = {item.move_id: item.begin.missing for item in answer.items if item.begin}
        sending = [e for e in pending if not e.committed and missing.get(e.move_id)]
        if not sending:
            return None
        offer = answer.data
        if offer is not None:
            parts = [Outgoing(e.tier, e.live.slots, missing[e.move_id]) for e in sending if e.tier]
            address = self.data_address(peer.host, offer.port)

            def taken() -> None:
                for e in sending:
                    e.sent += len(missing[e.move_id])
                    e.via_data = True

            ask = asking_commit if offer.commit else None
            body = send_blocks(address, offer.ticket, parts, self.timeout_s, taken, ask)
            return None if body is None else _commit_answer(body)
        buf = bytearray()
        begins = {item.move_id: item.begin for item in answer.items if item.begin}
        for e in sending:
            assert e.tier is not None
            begin = begins[e.move_id]
            e.sent += self.exporter.send_chunks(peer, e.live, e.tier, e.move_id, begin, buf)
        return None

    def _commit(self, peer: Peer, pending: list[_Entry], answer: BatchCommitAnswer | None) -> None:
        """Read the commit's answer (asked over HTTP when ``answer`` is None)."""
        if not pending:
            return
        if answer is None:
            answer = peer.commit_batch([e.move_id for e in pending])
        by_id = {item.move_id: item for item in answer.items}
        for e in pending:
            item = by_id.get(e.move_id)
            if item is not None and item.commit is not None:
                e.committed = True
                continue
            refusal = None if item is None else item.refused
            error = peer.refused(refusal) if refusal is not None else PeerError("not committed")
            self._refused(peer, [e], error)

    def _refused(self, peer: Peer, entries: list[_Entry], exc: AgentparkError) -> None:
        """The target refused these (nothing of them committed): they stay here."""
        done = isinstance(exc, _REFUSED)  # refused outright: the record is closed
        self.exporter.records.mark_many([e.move_id for e in entries], DONE if done else SENDING)
        for e in entries:
            if done:
                peer.abort(e.move_id)
            self.exporter.let_go(e.live)
            e.outcome = exc

    def _drop(self, to: str, entries: list[_Entry], started: float) -> None:
        """The target owns these: drop them here in one transaction (refused: held in
        doubt, each, until a move is run again)."""
        exporter = self.exporter
        core = exporter.core
        if not entries:
            return
        ids = [e.move_id for e in entries]
        try:
            core.transitions.moved_out_many([e.live for e in entries], to, ids)
        except AgentparkError as exc:  # the target owns them; these rows could not say so
            for e in entries:
                exporter.held[e.live.key] = e.live
                e.outcome = PeerError(
                    f"moved to {to}, but not dropped here: {exc.message}",
                    move_id=e.move_id,
                    in_doubt=True,
                )
            return
        exporter.records.mark_many(ids, DONE)
        block = core.geometry.block_nbytes
        ms = (time.perf_counter() - started) * 1e3
        for e in entries:
            core.registry.remove(e.live)
            exporter.held.pop(e.live.key, None)
            core.registry.release(e.live)
            row = e.live.row
            e.outcome = MoveOutResult(
                move_id=e.move_id,
                tenant=row.tenant,
                session_id=row.session_id,
                to=to,
                blocks=len(e.manifest.digests),
                blocks_sent=e.sent,
                blocks_held=e.held,
                bytes_sent=e.sent * block,
                retries=e.retries,
                resumed=e.resumed,
                data_port=e.via_data,
                ms=ms,
            )


def _commit_answer(body: bytes) -> BatchCommitAnswer:
    """The target's answer to a commit asked on the data connection; one that does not
    parse leaves the commit in doubt, as a lost one does (the begin asked again tells)."""
    try:
        return BatchCommitAnswer.model_validate_json(body)
    except ValueError as exc:
        raise DataCut(f"the target's commit answer does not parse: {exc}") from exc


def _batch(entries: list[_Entry], at: int, budget: int) -> list[_Entry]:
    """The next batch from ``entries[at]``: at most MAX_BATCH sessions whose manifests fit
    one begin body of ``budget`` bytes (at least one session)."""
    batch = [entries[at]]
    size = entries[at].size
    for e in entries[at + 1 : at + MAX_BATCH]:
        size += e.size + 1
        if size > budget:
            break
        batch.append(e)
    return batch
