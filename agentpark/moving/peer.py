"""The source's client of the target's ``/v1/moves/in`` routes (an admin token of it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any, cast

import httpx

from agentpark.errors import AgentparkError, InvalidStateError, TierFullError
from agentpark.moving.wire import (
    BLOCKS_HEADER,
    BatchBegin,
    BatchBeginAnswer,
    BatchCommit,
    BatchCommitAnswer,
    BeginAnswer,
    ChunkAnswer,
    CommitAnswer,
    LayoutMismatchError,
    MoveManifest,
    PeerError,
    Refusal,
)

__all__ = ["BodyTooLarge", "Peer"]

DEFAULT_BUDGET = 1_048_576 - 8192
"""Manifest bytes a batch begin carries until the target said its limit (the default
``limits.max_body_bytes``, less room for the envelope)."""


class BodyTooLarge(Exception):
    """A batch begin the target refused as too large (413): send it in smaller batches."""


_PIECE = 2**20


class Peer:
    """One target daemon. Transport failures raise httpx.TransportError (the caller picks
    the move up again); the target's refusals raise the error the source answers with."""

    def __init__(self, url: str, token: str, timeout_s: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.body_budget = DEFAULT_BUDGET  # manifest bytes one batch begin may carry
        self._client = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def begin(self, manifest: MoveManifest) -> BeginAnswer:
        answer = self._client.post(
            "/v1/moves/in",
            content=manifest.model_dump_json(),
            headers={"Content-Type": "application/json"},
        )
        return BeginAnswer.model_validate(self._ok(answer))

    def chunk(self, move_id: str, indices: list[int], data: memoryview) -> ChunkAnswer:
        answer = self._client.put(
            f"/v1/moves/in/{move_id}/blocks",
            # The tier's read buffer itself, in pieces: no copy into a bytes object, and a
            # Content-Length so the body is not chunk-framed.
            content=cast(Iterable[bytes], _pieces(data)),  # h11 sends any buffer
            headers={
                BLOCKS_HEADER: ",".join(map(str, indices)),
                "Content-Type": "application/octet-stream",
                "Content-Length": str(len(data)),
            },
        )
        return ChunkAnswer.model_validate(self._ok(answer))

    def commit(self, move_id: str) -> CommitAnswer:
        answer = self._client.post(f"/v1/moves/in/{move_id}/commit")
        return CommitAnswer.model_validate(self._ok(answer))

    def begin_batch(self, manifests: list[MoveManifest], data: bool) -> BatchBeginAnswer | None:
        """The batch begin; None from a target without the batch routes (an older one)."""
        content = BatchBegin(manifests=manifests, data=data).model_dump_json()
        answer = self._client.post(
            "/v1/moves/in-batch", content=content, headers={"Content-Type": "application/json"}
        )
        if answer.status_code in (404, 405):
            return None
        if answer.status_code == 413 and len(manifests) > 1:
            self.body_budget = len(content) // 2
            raise BodyTooLarge()
        begun = BatchBeginAnswer.model_validate(self._ok(answer))
        for item in begun.items:
            if item.begin is not None:  # the target's body limit, less room for the envelope
                self.body_budget = max(1024, item.begin.max_chunk_bytes - 4096)
        return begun

    def commit_batch(self, move_ids: list[str]) -> BatchCommitAnswer:
        body = BatchCommit(move_ids=move_ids)
        answer = self._client.post("/v1/moves/in-batch/commit", json=body.model_dump())
        return BatchCommitAnswer.model_validate(self._ok(answer))

    @property
    def host(self) -> str:
        """The target's host name, where its data port listens too."""
        return self._client.base_url.host

    def refused(self, refusal: Refusal) -> AgentparkError:
        """The error one refused session of a batch raises at the source."""
        return self._error(refusal.status, refusal.code, refusal.message)

    def abort(self, move_id: str) -> None:
        with contextlib.suppress(httpx.HTTPError):  # the target frees an idle import itself
            self._client.delete(f"/v1/moves/in/{move_id}")

    def _ok(self, answer: httpx.Response) -> Any:
        if answer.is_success:
            return answer.json()
        try:
            error = answer.json().get("error", {})
        except ValueError:
            error = {}
        message = error.get("message") or answer.text[:200]
        raise self._error(answer.status_code, error.get("code", ""), message)

    def _error(self, status: int, code: str, message: str) -> AgentparkError:
        said = f"the target {self.url} answered {status} {code}: {message}"
        details = {"peer": self.url, "peer_status": status, "peer_code": code}
        if status == 507:
            return TierFullError(said, **details)
        if code == LayoutMismatchError.code:
            return LayoutMismatchError(said, **details)
        if status == 409:
            return InvalidStateError(said, **details)
        return PeerError(said, **details)


def _pieces(data: memoryview) -> Iterator[memoryview]:
    for pos in range(0, len(data), _PIECE):
        yield data[pos : pos + _PIECE]
