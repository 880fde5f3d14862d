"""The bodies of the moves API, and the errors only a move answers."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from agentpark.errors import AgentparkError, ConflictError

__all__ = [
    "BatchBegin",
    "BatchBeginAnswer",
    "BatchCommit",
    "BatchCommitAnswer",
    "BeginAnswer",
    "ChunkAnswer",
    "CommitAnswer",
    "DataOffer",
    "DrainToRequest",
    "DrainToResult",
    "LayoutMismatchError",
    "MoveFailure",
    "MoveManifest",
    "MoveOutRequest",
    "MoveOutResult",
    "PeerError",
    "Refusal",
]

BLOCKS_HEADER = "X-Agentpark-Blocks"
"""The block indices (comma-separated, session order) a chunk's body holds, in order."""


class PeerError(AgentparkError):
    """The target daemon refused the move or could not be reached; this daemon keeps the
    session (``details``: the target's status and error, and the move id to run again)."""

    status = 502
    code = "peer_failed"


class LayoutMismatchError(ConflictError):
    """The target runs another model or KV layout: the blocks would mean nothing there."""

    code = "layout_mismatch"


class MoveManifest(BaseModel):
    """What the target needs to take a parked session over, all but the blocks' bytes."""

    move_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    source: str = Field(max_length=512)
    tenant: str = Field(min_length=1, max_length=128)
    session_id: str = Field(min_length=1, max_length=128)
    model_uid: str
    block_size: int = Field(ge=1)
    arrays: list[tuple[list[int], str]]
    token_log: str = Field(description="int32 little-endian token ids, base64")
    next_logits: str | None = Field(None, description="float32 logits, base64")
    metadata: dict[str, Any] = Field(default_factory=dict)
    tool: str | None = None
    paused_at: float | None = None
    expected_resume_at: float | None = None
    created_at: float
    last_active_at: float
    pause_count: int = 0
    keys: list[str | None] = Field(description="each block's key (hex), None: private")
    digests: list[str] = Field(description="each block's xxh3b digest, checked on arrival")


class BeginAnswer(BaseModel):
    move_id: str
    committed: bool = Field(description="the target owns the session already (a retry)")
    missing: list[int] = Field(description="block indices the target still needs")
    held: int = Field(0, description="blocks the target held already by content")
    max_chunk_bytes: int


class ChunkAnswer(BaseModel):
    move_id: str
    received: int = Field(description="blocks of this move verified and written so far")
    missing: int


class CommitAnswer(BaseModel):
    move_id: str
    session_id: str
    tier: str
    blocks: int
    blocks_received: int = Field(description="blocks this move wrote (each once)")


MAX_BATCH = 64
"""Sessions one batch begin or commit names at most (the target's open imports, too)."""


class Refusal(BaseModel):
    """One session of a batch the target refused (the error it would have answered)."""

    status: int
    code: str
    message: str


class BatchBegin(BaseModel):
    manifests: list[MoveManifest] = Field(min_length=1, max_length=MAX_BATCH)
    data: bool = Field(False, description="the source can send on the data port")


class BeginItem(BaseModel):
    move_id: str
    begin: BeginAnswer | None = None
    refused: Refusal | None = None


class DataOffer(BaseModel):
    """Where and how to send the batch's missing blocks off the HTTP path
    (agentpark.moving.dataport): one connection, the ticket first, then every missing
    block of the batch in the order of its items and their ``missing`` lists."""

    port: int
    ticket: str
    expires_s: float
    nbytes: int = Field(description="exactly what the connection may carry")
    commit: bool = Field(
        False,
        description="after its blocks, the connection may ask the commit of the batch's "
        "moves begun here (instead of the commit route)",
    )


class BatchBeginAnswer(BaseModel):
    items: list[BeginItem]
    data: DataOffer | None = None


class BatchCommit(BaseModel):
    move_ids: list[str] = Field(min_length=1, max_length=MAX_BATCH)


class CommitItem(BaseModel):
    move_id: str
    commit: CommitAnswer | None = None
    refused: Refusal | None = None


class BatchCommitAnswer(BaseModel):
    items: list[CommitItem]


class MoveOutRequest(BaseModel):
    tenant: str = Field("default", min_length=1, max_length=128)
    session_id: str = Field(min_length=1, max_length=128)
    to: str = Field(min_length=1, max_length=512, description="the target daemon's URL")
    to_token: str = Field(min_length=1, max_length=256, description="an admin token of it")


class MoveOutResult(BaseModel):
    move_id: str
    tenant: str
    session_id: str
    to: str
    blocks: int
    blocks_sent: int
    blocks_held: int = Field(description="blocks the target held by content: not sent")
    bytes_sent: int
    retries: int = Field(description="connections dropped and picked up again")
    resumed: bool = Field(description="an earlier attempt of this move was picked up")
    data_port: bool = Field(False, description="its blocks went over the target's data port")
    ms: float


class DrainToRequest(BaseModel):
    to: str = Field(min_length=1, max_length=512)
    to_token: str = Field(min_length=1, max_length=256)
    tenant: str | None = Field(None, max_length=128, description="only this tenant's")


class MoveFailure(BaseModel):
    tenant: str
    session_id: str
    error: str


class DrainToResult(BaseModel):
    moved: int
    bytes_sent: int
    not_parked: int = Field(description="live sessions left here: not parked")
    data_port: int = Field(0, description="sessions whose blocks went over the data port")
    failed: list[MoveFailure]
    ms: float
