"""The source's client of the target's ``/v1/moves/in`` routes (an admin token of it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any, cast

import httpx

from agentpark.errors import InvalidStateError, TierFullError
from agentpark.moving.wire import (
    BLOCKS_HEADER,
    BeginAnswer,
    ChunkAnswer,
    CommitAnswer,
    LayoutMismatchError,
    MoveManifest,
    PeerError,
)

__all__ = ["Peer"]

_PIECE = 2**20


class Peer:
    """One target daemon. Transport failures raise httpx.TransportError (the caller picks
    the move up again); the target's refusals raise the error the source answers with."""

    def __init__(self, url: str, token: str, timeout_s: float = 60.0) -> None:
        self.url = url.rstrip("/")
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
        code = error.get("code", "")
        said = f"the target {self.url} answered {answer.status_code} {code}: {message}"
        details = {"peer": self.url, "peer_status": answer.status_code, "peer_code": code}
        if answer.status_code == 507:
            raise TierFullError(said, **details)
        if code == LayoutMismatchError.code:
            raise LayoutMismatchError(said, **details)
        if answer.status_code == 409:
            raise InvalidStateError(said, **details)
        raise PeerError(said, **details)


def _pieces(data: memoryview) -> Iterator[memoryview]:
    for pos in range(0, len(data), _PIECE):
        yield data[pos : pos + _PIECE]
