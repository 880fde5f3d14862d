"""The target's side of a move: slots reserved by content, blocks verified as they land,
the session committed parked.

An import lives in memory from its manifest to its commit (or until it is left idle for
:data:`IDLE_S`): a dropped connection loses nothing verified, and the source's retry is
told what is still missing. A target that restarts mid-move has reserved nothing in
SQLite (the slots were never in a session's handle), so they are free again and the
source sends the move again from the start.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from agentpark.enums import EventKind, State, TierChoice
from agentpark.errors import (
    AgentparkError,
    InvalidRequestError,
    NotReadyError,
    SessionExistsError,
)
from agentpark.moving.landing import Landing
from agentpark.moving.wire import (
    BeginAnswer,
    ChunkAnswer,
    CommitAnswer,
    LayoutMismatchError,
    MoveManifest,
)
from agentpark.parking.core import SessionCore
from agentpark.parking.registry import LiveSession
from agentpark.parking.transitions.moves import MovedIn, move_detail
from agentpark.store.models import SessionRow
from agentpark.tiers.base import BackendHeldTier, HostTier

__all__ = ["IDLE_S", "MAX_OPEN", "Importer"]

log = logging.getLogger(__name__)

IDLE_S = 600.0
"""An import no chunk touched for this long is dropped (its slots freed)."""
MAX_OPEN = 64
"""Imports open at once; more answer 503 (a drain moves one session at a time)."""
_BODY_SLACK = 4096
_DONE_KEPT = 4096


class Importer:
    """Imports into one session core's tiers (persistent ones first)."""

    def __init__(self, core: SessionCore, max_body_bytes: int) -> None:
        self.core = core
        self._max_body_bytes = max_body_bytes
        self._open: dict[str, Landing] = {}
        self._done: OrderedDict[str, CommitAnswer] = OrderedDict()  # answers to a retry
        self._lock = threading.Lock()

    @property
    def max_chunk_bytes(self) -> int:
        """The most block bytes one chunk may carry here (at least one block): read when
        asked, since an external engine's layout (vLLM mode) is known only once it
        registered."""
        return max(self._max_body_bytes - _BODY_SLACK, self.core.geometry.block_nbytes)

    # ---- begin -----------------------------------------------------------------------------

    def begin(self, manifest: MoveManifest) -> BeginAnswer:
        """Reserve (or pick up) the move's slots; which blocks are still to send."""
        self._expire()
        move_id = manifest.move_id
        with self._lock:
            pending = self._open.get(move_id)
        if pending is not None and pending.manifest != manifest:
            # The source's copy changed between two attempts (resumed and parked again):
            # what was kept is of the old one.
            self.abort(move_id)
            pending = None
        if pending is None and self._committed(manifest):
            return BeginAnswer(
                move_id=move_id, committed=True, missing=[], max_chunk_bytes=self.max_chunk_bytes
            )
        if pending is None:
            pending = self._reserve(manifest)
        pending.touched = time.monotonic()
        fresh = pending.reservation.to_copy
        return BeginAnswer(
            move_id=move_id,
            committed=False,
            missing=pending.missing(),
            held=len(manifest.digests) - len(fresh),
            max_chunk_bytes=self.max_chunk_bytes,
        )

    def _reserve(self, manifest: MoveManifest) -> Landing:
        self._check_layout(manifest)
        if self.core.registry.find((manifest.tenant, manifest.session_id)) is not None:
            raise SessionExistsError(manifest.session_id)
        n = len(manifest.digests)
        if len(manifest.keys) != n:
            raise InvalidRequestError(f"{len(manifest.keys)} keys for {n} blocks")
        if self.core.geometry.blocks_for(len(_tokens(manifest))) != n:
            raise InvalidRequestError(f"{n} blocks do not hold the session's token log")
        keys: list[Hashable | None] = [
            None if k is None else (manifest.tenant, bytes.fromhex(k)) for k in manifest.keys
        ]
        with self._lock:
            if manifest.move_id in self._open:
                return self._open[manifest.move_id]
            if len(self._open) >= MAX_OPEN:
                raise NotReadyError(f"{MAX_OPEN} moves are open here; retry", retry_after_s=5)
            candidates = [t for t in self._candidates() if not isinstance(t, BackendHeldTier)]
            owner = ("move", manifest.move_id)
            tier, reservation = self.core.mover.reserve(owner, candidates, keys)  # 507
            pending = Landing(manifest, tier, reservation, keys)
            self._open[manifest.move_id] = pending
        return pending

    def _candidates(self) -> list[HostTier]:
        """Persistent tiers first: a session that moved should survive a restart here."""
        tiers = self.core.mover.candidates(TierChoice.AUTO)
        return sorted(tiers, key=lambda t: not t.persistent)

    def _check_layout(self, manifest: MoveManifest) -> None:
        geometry = self.core.geometry
        model_uid = self.core.host.model_uid
        mine = [(list(a.block_shape), a.dtype) for a in geometry.arrays]
        theirs = [(list(shape), dtype) for shape, dtype in manifest.arrays]
        why = None
        if manifest.model_uid != model_uid:
            why = f"the target runs model {model_uid!r}, the session is of {manifest.model_uid!r}"
        elif manifest.block_size != geometry.block_size:
            why = f"block size {manifest.block_size} here is {geometry.block_size}"
        elif theirs != mine:
            why = f"KV layout {theirs} differs from this daemon's {mine}"
        if why is not None:
            raise LayoutMismatchError(f"cannot take this session: {why}", model_uid=model_uid)

    def _committed(self, manifest: MoveManifest) -> bool:
        """Whether this move was committed here already (an earlier attempt, a restart)."""
        detail = move_detail("from", manifest.source, manifest.move_id)
        live = self.core.registry.find((manifest.tenant, manifest.session_id))
        if live is None:
            return False
        events = self.core.store.events(manifest.tenant, manifest.session_id, 50)
        return any(e.kind == EventKind.MOVED_IN and e.detail == detail for e in events)

    # ---- blocks ----------------------------------------------------------------------------

    def chunk(self, move_id: str, indices: Sequence[int], body: bytes | memoryview) -> ChunkAnswer:
        """Verify each block of ``body`` against its digest and write it to its slot.

        All or nothing per chunk: a block that fails its digest refuses the chunk (422)
        before any of it is written, so a retry sends it whole again.
        """
        pending = self._pending(move_id)
        block = self.core.geometry.block_nbytes
        if len(body) != block * len(indices):
            raise InvalidRequestError(
                f"{len(body)} bytes for {len(indices)} blocks of {block} bytes"
            )
        pending.take_chunk(indices, body, block)
        return ChunkAnswer(
            move_id=move_id, received=len(pending.received), missing=len(pending.missing())
        )

    # ---- commit and abort ------------------------------------------------------------------

    def commit(self, move_id: str) -> CommitAnswer:
        """Write the session parked here (one write with its ``moved_in`` event); from then
        on this daemon owns it. A commit asked again after it succeeded answers the same."""
        answer = self.commit_many([move_id])[0]
        if isinstance(answer, AgentparkError):
            raise answer
        return answer

    def commit_many(self, move_ids: Sequence[str]) -> list[CommitAnswer | AgentparkError]:
        """Commit every complete import of ``move_ids`` in ONE SQLite transaction (each row
        PARKED with its ``moved_in`` event); an answer or a refusal per move, in order.
        Refused by the database (503): nothing is committed, every import stays open with
        its blocks for a retry."""
        results: dict[str, CommitAnswer | AgentparkError] = {}
        pendings: list[Landing] = []
        for move_id in dict.fromkeys(move_ids):
            with self._lock:
                pending = self._open.get(move_id)
            if pending is not None:
                pendings.append(pending)
                continue
            try:
                results[move_id] = self._commit_again(move_id)
            except AgentparkError as exc:
                results[move_id] = exc
        with contextlib.ExitStack() as stack:
            for pending in sorted(pendings, key=lambda p: p.manifest.move_id):
                stack.enter_context(pending.lock)  # one order: no two commits deadlock
            ready: list[tuple[Landing, MovedIn]] = []
            olds = self.core.store.get_many([_key(p.manifest) for p in pendings])
            for pending in pendings:
                done = self._done.get(pending.manifest.move_id)
                if done is not None:  # a commit that held its lock first did it (a retry)
                    results[pending.manifest.move_id] = done
                    continue
                try:
                    ready.append(
                        (pending, self._moved_in(pending, olds.get(_key(pending.manifest))))
                    )
                except AgentparkError as exc:
                    results[pending.manifest.move_id] = exc
            try:
                self._write(ready)
            except AgentparkError as exc:
                results.update({p.manifest.move_id: exc for p, _ in ready})
            else:
                results.update({p.manifest.move_id: self._committed_answer(p) for p, _ in ready})
        return [results[move_id] for move_id in move_ids]

    def _moved_in(self, pending: Landing, old: SessionRow | None) -> MovedIn:
        """What the commit writes of one complete import (refused: incomplete, gone)."""
        if not pending.open:
            raise InvalidRequestError(f"move {pending.manifest.move_id} was given up here")
        missing = pending.missing()
        if missing:
            raise InvalidRequestError(f"{len(missing)} blocks still missing", missing=len(missing))
        manifest = pending.manifest
        tokens = _tokens(manifest)
        logits = None
        if manifest.next_logits is not None:
            raw = base64.b64decode(manifest.next_logits)
            logits = np.frombuffer(raw, dtype=np.float32).copy()
        row = _row(manifest, tokens, old)
        return MovedIn(
            live=LiveSession(row.row, tokens, logits),
            tier=pending.tier,
            slots=pending.reservation.slots,
            keys=pending.keys,
            digests=list(manifest.digests),
            peer=manifest.source,
            move_id=manifest.move_id,
            nbytes=pending.written * self.core.geometry.block_nbytes,
            duration_ms=(time.perf_counter() - pending.started) * 1e3,
            revive=row.revive,
        )

    def _write(self, ready: list[tuple[Landing, MovedIn]]) -> None:
        """The batch's rows in one transaction, then each session's slots and registry."""
        if not ready:
            return
        for tier in {id(p.tier): p.tier for p, _ in ready}.values():
            tier.flush()
        with self.core.registry.adding() as sessions:
            keys = [m.live.key for _, m in ready]
            taken = [k for k in keys if k in sessions] or [k for k in keys if keys.count(k) > 1]
            if taken:
                raise SessionExistsError(taken[0][1])
            self.core.transitions.moved_in_many([m for _, m in ready])  # 503: kept open
            for pending, moved in ready:
                res, live = pending.reservation, moved.live
                by_slot = {res.slots[i]: moved.digests[i] for i in res.to_copy}
                # Routers hear the session, not the import, as these blocks' owner.
                pending.tier.seal(pending.owner, by_slot, announce_as=live.key)
                pending.tier.hand_over(pending.owner, live.key)
                self.core.registry.add(live)

    def _committed_answer(self, pending: Landing) -> CommitAnswer:
        manifest, res = pending.manifest, pending.reservation
        move_id = manifest.move_id
        with self._lock:
            self._open.pop(move_id, None)
        while len(self._done) >= _DONE_KEPT:
            self._done.popitem(last=False)
        self._done[move_id] = CommitAnswer(
            move_id=move_id,
            session_id=manifest.session_id,
            tier=pending.tier.name,
            blocks=len(res.slots),
            blocks_received=pending.written,
        )
        log.info(
            "moved in %s/%s from %s (move %s): %d blocks, %d received",
            manifest.tenant,
            manifest.session_id,
            manifest.source,
            move_id,
            len(res.slots),
            pending.written,
        )
        return self._done[move_id]

    def _commit_again(self, move_id: str) -> CommitAnswer:
        done = self._done.get(move_id)
        if done is None:
            raise InvalidRequestError(
                f"no open move {move_id} here (never begun, expired, or the daemon restarted): "
                "begin it again"
            )
        return done

    def received(self, move_id: str) -> int | None:
        """Blocks of an open move verified and written so far (None: not open here)."""
        with self._lock:
            pending = self._open.get(move_id)
        return None if pending is None else len(pending.received)

    def abort(self, move_id: str) -> None:
        with self._lock:
            pending = self._open.pop(move_id, None)
        if pending is not None:
            pending.close()  # a landing in progress ends first: its slots stay its own
            pending.tier.free(pending.owner)

    def close(self) -> None:
        with self._lock:
            ids = list(self._open)
        for move_id in ids:
            self.abort(move_id)

    # ---- inside ----------------------------------------------------------------------------

    def landing(self, move_id: str) -> Landing | None:
        """An open import's landing (the data port writes into it), or None."""
        with self._lock:
            return self._open.get(move_id)

    def _pending(self, move_id: str) -> Landing:
        pending = self.landing(move_id)
        if pending is None:
            raise InvalidRequestError(f"no open move {move_id} here: begin it again")
        return pending

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            stale = [m for m, p in self._open.items() if now - p.touched > IDLE_S]
        for move_id in stale:
            log.warning(
                "move %s: no chunk for %.0f s; its reserved slots are freed", move_id, IDLE_S
            )
            self.abort(move_id)


@dataclass
class _NewRow:
    row: SessionRow
    revive: bool


def _tokens(manifest: MoveManifest) -> list[int]:
    raw = base64.b64decode(manifest.token_log)
    if len(raw) % 4:
        raise InvalidRequestError("token_log is not int32 values")
    tokens: list[int] = np.frombuffer(raw, dtype="<i4").astype(int).tolist()
    return tokens


def _row(manifest: MoveManifest, tokens: list[int], old: SessionRow | None) -> _NewRow:
    """The session's row: the one deleted here before (revived), or a new one."""
    if old is not None and old.state != State.DELETED:
        raise SessionExistsError(manifest.session_id)
    row = old or SessionRow(session_id=manifest.session_id, tenant=manifest.tenant)
    row.tier, row.num_tokens = None, len(tokens)  # the transition parks it
    row.created_at, row.last_active_at = manifest.created_at, manifest.last_active_at
    row.paused_at, row.pause_count = manifest.paused_at, manifest.pause_count
    row.tool, row.expected_resume_at = manifest.tool, manifest.expected_resume_at
    row.meta = dict(manifest.metadata)
    row.token_log = base64.b64decode(manifest.token_log)
    row.next_logits = (
        None if manifest.next_logits is None else base64.b64decode(manifest.next_logits)
    )
    return _NewRow(row, old is not None)


def _key(manifest: MoveManifest) -> tuple[str, str]:
    return (manifest.tenant, manifest.session_id)
